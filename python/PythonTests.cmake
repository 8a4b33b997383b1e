# The Python package's tests in a C++ build (included by the top-level CMakeLists.txt when the
# tests are built and the extension modules are not): one CTest test that builds the package
# with the venv's pip into this build tree and runs pytest (python/run_tests.sh). The package is
# built CPU-only here unless ATTNSTATE_PYTHON_TEST_CUDA is on (scripts/gpu-check.sh builds and
# tests the CUDA package itself), so that the CUDA kernels are not compiled twice.
set(ATTNSTATE_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "Python with nanobind, scikit-build-core, numpy and pytest for the package's tests")
option(ATTNSTATE_PYTHON_TEST_CUDA "Build the package of the python_package test with CUDA" OFF)
set(attnstate_py_cmake_args "")
if(NOT ATTNSTATE_PYTHON_TEST_CUDA)
  set(attnstate_py_cmake_args "-DATTNSTATE_ENABLE_CUDA=OFF")
endif()
add_test(NAME python_package
         COMMAND ${CMAKE_COMMAND} -E env "PY_CMAKE_ARGS=${attnstate_py_cmake_args}"
                 ${PROJECT_SOURCE_DIR}/python/run_tests.sh ${ATTNSTATE_PYTHON}
                 ${CMAKE_BINARY_DIR}/python)
# 77: the venv lacks the build tools (reported as skipped, not passed).
set_tests_properties(python_package PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 1500 LABELS python)
