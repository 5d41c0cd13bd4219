# Helpers shared by every module's CMakeLists.txt.
include(GoogleTest)

# Warnings as errors for our own code only (third-party headers come in as SYSTEM).
set(TANDEM_WARNINGS -Wall -Wextra -Werror -Wno-unused-parameter)
if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  list(APPEND TANDEM_WARNINGS -Wthread-safety)
endif()

# tandem_library(NAME SRCS a.cc b.cc DEPS dep1 dep2 [PRIVATE_DEPS ...])
# A module library; headers are included as "runtime/<module>/<file>.h" from the repo root.
function(tandem_library name)
  cmake_parse_arguments(T "" "" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  if(T_SRCS)
    add_library(${name} STATIC ${T_SRCS})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
    target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${TANDEM_WARNINGS}>)
    target_link_libraries(${name} PUBLIC ${T_DEPS} PRIVATE ${T_PRIVATE_DEPS})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${name} INTERFACE ${T_DEPS})
  endif()
endfunction()

# tandem_test(NAME SRCS a_test.cc DEPS lib... [LABELS unit|integration|e2e|gpu] [TIMEOUT s])
# A GoogleTest binary; each TEST becomes one ctest entry so `ctest -j` spreads them.
# A test that calls GTEST_SKIP() is reported by ctest as skipped, never as passed.
function(tandem_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${name} ${T_SRCS})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${TANDEM_WARNINGS}>)
  target_link_libraries(${name} PRIVATE ${T_DEPS} tandem_test_main GTest::gtest GTest::gmock)
  # Tests run with the source root as working directory; these name both trees explicitly.
  target_compile_definitions(${name} PRIVATE TANDEM_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                             TANDEM_BUILD_DIR="${PROJECT_BINARY_DIR}")
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
               SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
               ENVIRONMENT "TANDEM_BUILD_DIR=${PROJECT_BINARY_DIR}")
endfunction()
