# CPU model runner (tandem_cpu_runner): the reference ModelRunner over host float32 weights.
tandem_library(tandem_cpu_runner
  SRCS cpu_model_runner.cc
  DEPS tandem_model tandem_kernels absl::status absl::statusor absl::str_format)
tandem_test(cpu_model_runner_test
  SRCS cpu_model_runner_test.cc
  DEPS tandem_cpu_runner tandem_kernels
  LABELS unit)
