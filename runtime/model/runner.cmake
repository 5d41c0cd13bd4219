# CPU model runner (tandem_cpu_runner): the reference ModelRunner over host float32 weights.
# It needs only the model headers (config, weights); tandem_model is linked so users of the runner
# get the loader too.
set(_tandem_cpu_runner_deps tandem_kernels absl::status absl::statusor absl::str_format)
if(TARGET tandem_model)
  list(APPEND _tandem_cpu_runner_deps tandem_model)
endif()
tandem_library(tandem_cpu_runner
  SRCS cpu_model_runner.cc
  DEPS ${_tandem_cpu_runner_deps})
tandem_test(cpu_model_runner_test
  SRCS cpu_model_runner_test.cc
  DEPS tandem_cpu_runner tandem_kernels
  LABELS unit)
