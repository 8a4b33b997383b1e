# Helpers shared by the build files of attnstate.

# Warnings for host C++ and for nvcc's host compiler.
set(ATTNSTATE_CXX_WARNINGS -Wall -Wextra -Wpedantic -Wno-unused-parameter)

# attnstate_component(<name> [EXPORT_NAME <export>] SOURCES ... [LIBS ...])
# A component library of the backends (e.g. attnstate_cpu_decode), built and tested alone. It is
# exported as attnstate::<export> (default: <name> without the "attnstate_" prefix) and the same
# name is an alias in the build tree, so add_subdirectory and find_package users see one set of
# names. Users link the backend targets (attnstate_backend below), not the components.
function(attnstate_component name)
  cmake_parse_arguments(ARG "" "EXPORT_NAME" "SOURCES;LIBS" ${ARGN})
  # A component is its explicit source list: a missing list or file is a configure error, never
  # a component (and its tests) silently left out.
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "attnstate: component ${name} has no SOURCES")
  endif()
  foreach(src ${ARG_SOURCES})
    if(NOT IS_ABSOLUTE "${src}")
      set(src "${CMAKE_CURRENT_SOURCE_DIR}/${src}")
    endif()
    if(NOT EXISTS "${src}")
      message(FATAL_ERROR "attnstate: component ${name}: source ${src} does not exist")
    endif()
  endforeach()
  add_library(${name} STATIC ${ARG_SOURCES})
  target_link_libraries(${name} PUBLIC attnstate_core ${ARG_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${ATTNSTATE_CXX_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-Wall>)
  set(export_name ${ARG_EXPORT_NAME})
  if(NOT export_name)
    string(REPLACE "attnstate_" "" export_name ${name})
  endif()
  set_target_properties(${name} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF EXPORT_NAME ${export_name})
  add_library(attnstate::${export_name} ALIAS ${name})
  set_property(GLOBAL APPEND PROPERTY ATTNSTATE_EXPORTED_TARGETS ${name})
endfunction()

# attnstate_backend(<name> EXPORT_NAME <export> COMPONENTS ...)
# A public backend target (attnstate::cpu, attnstate::cuda): an INTERFACE library linking every
# component of COMPONENTS (each must exist), so a user linking it gets the whole backend. Exported
# and aliased as attnstate::<export>.
function(attnstate_backend name)
  cmake_parse_arguments(ARG "" "EXPORT_NAME" "COMPONENTS" ${ARGN})
  add_library(${name} INTERFACE)
  foreach(component ${ARG_COMPONENTS})
    if(NOT TARGET ${component})
      message(FATAL_ERROR "attnstate: backend ${name}: component ${component} was not defined")
    endif()
    target_link_libraries(${name} INTERFACE ${component})
  endforeach()
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${ARG_EXPORT_NAME})
  add_library(attnstate::${ARG_EXPORT_NAME} ALIAS ${name})
  set_property(GLOBAL APPEND PROPERTY ATTNSTATE_EXPORTED_TARGETS ${name})
endfunction()

# attnstate_add_gtest(<name> SOURCES ... [LIBS ...])
# A GoogleTest executable registered with CTest (each TEST a CTest test).
function(attnstate_add_gtest name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  # tests/common, and src/ for the internal headers (the catalog, whose head dims the tests draw)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common
                                             ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main Threads::Threads)
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${ATTNSTATE_CXX_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 PROPERTIES LABELS "${name}")
endfunction()
