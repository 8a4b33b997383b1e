# Script mode: builds and runs a consumer project (consumer: attnstate::attnstate, consumer_cpu:
# attnstate::cpu alone, calling cpu::decode and cpu::cascade_attention; in MODE=install with a
# CUDA package also consumer_cuda: attnstate::cuda alone, a link test).
#   MODE=install: installs BUILD_DIR into WORK_DIR/prefix, then find_package(attnstate) from there
#                 with RapidCheck unavailable; with TESTING_KIT=ON also a consumer of
#                 COMPONENTS testing (RapidCheck available) builds and runs.
#   MODE=subdir:  the consumer add_subdirectory()s SOURCE_DIR with RapidCheck and GoogleTest
#                 unavailable.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
set(args -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_DISABLE_FIND_PACKAGE_rapidcheck=TRUE)
if(MODE STREQUAL "install")
  run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build ${args}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
else()
  run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build ${args}
      -DCMAKE_DISABLE_FIND_PACKAGE_GTest=TRUE
      -DATTNSTATE_SOURCE_DIR=${SOURCE_DIR} -DATTNSTATE_ENABLE_CUDA=OFF)
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2)
run(${WORK_DIR}/build/consumer)
run(${WORK_DIR}/build/consumer_cpu)
if(EXISTS ${WORK_DIR}/build/consumer_cuda)
  run(${WORK_DIR}/build/consumer_cuda)
endif()

if(MODE STREQUAL "install" AND TESTING_KIT)
  run(${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build-testing -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
      -DATTNSTATE_CONSUMER_TESTING=ON -Drapidcheck_DIR=${RAPIDCHECK_DIR})
  run(${CMAKE_COMMAND} --build ${WORK_DIR}/build-testing -j 2)
  run(${WORK_DIR}/build-testing/consumer_testing)
endif()
