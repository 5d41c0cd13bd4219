// A model directory's JSON files: config.json (ParseModelConfig: architecture, dimensions, RoPE
// scaling, token ids) and tokenizer_config.json (ReadChatTemplateSource and
// ChatTemplate::FromModelDir: the chat template as a string or a list of named templates,
// bos/eos tokens as strings or {"content": ...}), which is rendered once when it compiles.
//
// Input: one mode byte (low bit: 0 config.json, 1 tokenizer_config.json), then the file's text.
// Properties: no crash; an accepted config.json satisfies what the runners rely on (positive
// dimensions, num_key_value_heads dividing num_attention_heads, an even head_dim, positive
// epsilon and theta, a sane llama3 rope_scaling).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "runtime/model/chat_template.h"
#include "runtime/model/jinja_chat_template.h"
#include "runtime/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) {
    absl::StatusOr<tandem::ModelConfig> c = tandem::ParseModelConfig(text, "config.json");
    if (!c.ok()) return 0;
    FUZZ_CHECK(c->vocab_size > 0 && c->hidden_size > 0 && c->intermediate_size > 0);
    FUZZ_CHECK(c->num_layers > 0 && c->num_heads > 0 && c->num_kv_heads > 0);
    FUZZ_CHECK(c->num_heads % c->num_kv_heads == 0);
    FUZZ_CHECK(c->head_dim > 0 && c->head_dim % 2 == 0);
    FUZZ_CHECK(c->max_position_embeddings > 0);
    FUZZ_CHECK(c->rms_norm_eps > 0.0f && c->rope_theta > 0.0f);
    if (c->rope_scaling.kind == tandem::RopeScaling::Kind::kLlama3) {
      const tandem::RopeScaling& r = c->rope_scaling;
      FUZZ_CHECK(r.factor > 0.0f && r.low_freq_factor > 0.0f);
      FUZZ_CHECK(r.high_freq_factor > r.low_freq_factor);
      FUZZ_CHECK(r.original_max_position_embeddings > 0);
    }
    return 0;
  }

  const std::string dir = tandem::fuzz::ScratchDir() + "/model";
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  tandem::fuzz::WriteFile(dir + "/tokenizer_config.json", text);
  absl::StatusOr<tandem::ChatTemplateSource> source = tandem::ReadChatTemplateSource(dir);
  absl::StatusOr<std::unique_ptr<tandem::ChatTemplate>> t = tandem::ChatTemplate::FromModelDir(dir);
  FUZZ_CHECK(!t.ok() || source.ok());
  if (!t.ok()) return 0;
  const std::vector<tandem::ChatMessage> messages = {
      {"system", "You are helpful."}, {"user", "Hello!"}, {"assistant", "Hi."}, {"user", "Bye"}};
  (void)(*t)->Render(messages, /*add_generation_prompt=*/true);
  return 0;
}
