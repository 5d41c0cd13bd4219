# Tokenizer: Hugging Face tokenizer.json BPE (byte-level and SentencePiece-style), incremental
# detokenizer. PCRE2 for the pre-tokenizer regexes, ICU for Unicode normalization.
pkg_check_modules(ICU_UC REQUIRED IMPORTED_TARGET icu-uc)
set(_tok_dir ${CMAKE_CURRENT_LIST_DIR})

tandem_library(tandem_tokenizer
  SRCS ${_tok_dir}/tokenizer.cc ${_tok_dir}/tokenizer_components.cc
       ${_tok_dir}/tokenizer_unicode.cc ${_tok_dir}/incremental_detokenizer.cc
  DEPS tandem_base absl::status absl::statusor
  PRIVATE_DEPS absl::strings absl::str_format absl::flat_hash_map nlohmann_json::nlohmann_json
               PkgConfig::PCRE2 PkgConfig::ICU_UC)

tandem_test(tandem_tokenizer_test
  SRCS ${_tok_dir}/tokenizer_test.cc ${_tok_dir}/tokenizer_unicode_test.cc
       ${_tok_dir}/incremental_detokenizer_test.cc
  DEPS tandem_tokenizer nlohmann_json::nlohmann_json PkgConfig::PCRE2 PkgConfig::ICU_UC
       absl::flat_hash_map absl::strings
  LABELS unit)
