# Chat templates: a small Jinja interpreter (jinja_*) and ChatTemplate over it.
tandem_library(tandem_chat_template
  SRCS chat_template.cc jinja_lexer.cc jinja_parser.cc jinja_template.cc jinja_value.cc
  DEPS tandem_base nlohmann_json::nlohmann_json absl::status absl::statusor absl::strings
       absl::str_format absl::flat_hash_map)

tandem_test(jinja_test
  SRCS jinja_test.cc
  DEPS tandem_chat_template
  LABELS unit)

tandem_test(chat_template_test
  SRCS chat_template_test.cc
  DEPS tandem_chat_template Threads::Threads
  LABELS unit)
