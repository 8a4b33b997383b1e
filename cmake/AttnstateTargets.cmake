# Helpers shared by the build files of attnstate.

# Warnings for host C++ and for nvcc's host compiler.
set(ATTNSTATE_CXX_WARNINGS -Wall -Wextra -Wpedantic -Wno-unused-parameter)

# attnstate_component(<name> LANGUAGE CXX|CUDA SOURCES ... [LIBS ...])
# A component library of the backends (e.g. attnstate_cpu_merge). Components are linked
# together by the public targets attnstate::cpu and attnstate::cuda.
function(attnstate_component name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  if(NOT ARG_SOURCES)
    return()
  endif()
  add_library(${name} STATIC ${ARG_SOURCES})
  target_link_libraries(${name} PUBLIC attnstate_core ${ARG_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${ATTNSTATE_CXX_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-Wall>)
  string(REPLACE "attnstate_" "" export_name ${name})
  set_target_properties(${name} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF EXPORT_NAME ${export_name})
  set_property(GLOBAL APPEND PROPERTY ATTNSTATE_EXPORTED_TARGETS ${name})
endfunction()

# attnstate_add_gtest(<name> SOURCES ... [LIBS ...])
# A GoogleTest executable registered with CTest (each TEST a CTest test).
function(attnstate_add_gtest name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${ATTNSTATE_CXX_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 PROPERTIES LABELS "${name}")
endfunction()
