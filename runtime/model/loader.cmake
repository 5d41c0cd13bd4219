# HF config, safetensors (mmap), CPU weights and `tandem model synth`.
tandem_library(tandem_model
  SRCS model_config.cc safetensors.cc weights.cc synth.cc
  DEPS tandem_base nlohmann_json::nlohmann_json absl::status absl::statusor absl::strings
       absl::str_format Threads::Threads)

tandem_test(model_config_test SRCS model_config_test.cc DEPS tandem_model LABELS unit)
tandem_test(safetensors_test SRCS safetensors_test.cc DEPS tandem_model LABELS unit)
tandem_test(weights_test SRCS weights_test.cc DEPS tandem_model LABELS unit)
tandem_test(synth_test SRCS synth_test.cc DEPS tandem_model LABELS unit)
