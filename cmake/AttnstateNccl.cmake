# Finds NCCL for the dist component (attnstate::dist, the context-parallel merge): headers and
# library in ATTNSTATE_NCCL_ROOT, $NCCL_ROOT, the CUDA toolkit, the system, or the Python
# environment's NVIDIA wheel (nvidia-nccl-cu13: <site-packages>/nvidia/nccl/{include,lib}).
# Sets ATTNSTATE_NCCL_FOUND, ATTNSTATE_NCCL_INCLUDE_DIR and ATTNSTATE_NCCL_LIBRARY.
set(ATTNSTATE_NCCL_ROOT "" CACHE PATH "Where NCCL is installed (include/nccl.h, lib/libnccl.so)")
set(_attnstate_nccl_hints ${ATTNSTATE_NCCL_ROOT} $ENV{NCCL_ROOT})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _attnstate_nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
foreach(dir ${CUDAToolkit_INCLUDE_DIRS})
  get_filename_component(_root "${dir}" DIRECTORY)
  list(APPEND _attnstate_nccl_hints ${_root})
endforeach()
# The wheel, in the project's virtual environment (scripts/install-deps.sh puts it there when the
# toolkit has no NCCL) or in the Python CMake finds.
set(_attnstate_pythons)
if(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  list(APPEND _attnstate_pythons "${PROJECT_SOURCE_DIR}/.venv/bin/python")
endif()
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  list(APPEND _attnstate_pythons ${Python3_EXECUTABLE})
endif()
foreach(py ${_attnstate_pythons})
  execute_process(
    COMMAND ${py} -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE _attnstate_nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_QUIET RESULT_VARIABLE _attnstate_nccl_rc)
  if(_attnstate_nccl_rc EQUAL 0 AND _attnstate_nccl_wheel)
    list(APPEND _attnstate_nccl_hints ${_attnstate_nccl_wheel})
  endif()
endforeach()
find_path(ATTNSTATE_NCCL_INCLUDE_DIR nccl.h HINTS ${_attnstate_nccl_hints} PATH_SUFFIXES include)
# The wheel ships libnccl.so.2 only (no unversioned link).
find_library(ATTNSTATE_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_attnstate_nccl_hints}
             PATH_SUFFIXES lib lib64)
set(ATTNSTATE_NCCL_FOUND OFF)
if(ATTNSTATE_NCCL_INCLUDE_DIR AND ATTNSTATE_NCCL_LIBRARY)
  file(STRINGS "${ATTNSTATE_NCCL_INCLUDE_DIR}/nccl.h" _attnstate_nccl_major
       REGEX "^#define NCCL_MAJOR [0-9]+")
  file(STRINGS "${ATTNSTATE_NCCL_INCLUDE_DIR}/nccl.h" _attnstate_nccl_minor
       REGEX "^#define NCCL_MINOR [0-9]+")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _attnstate_nccl_major "${_attnstate_nccl_major}")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _attnstate_nccl_minor "${_attnstate_nccl_minor}")
  # Grouped send/recv and CUDA graph capture of the collectives: NCCL 2.9 and later.
  if(_attnstate_nccl_major GREATER 2 OR
     (_attnstate_nccl_major EQUAL 2 AND _attnstate_nccl_minor GREATER_EQUAL 9))
    set(ATTNSTATE_NCCL_FOUND ON)
  endif()
endif()
message(STATUS "attnstate: NCCL ${ATTNSTATE_NCCL_FOUND} (${_attnstate_nccl_major}.${_attnstate_nccl_minor}: "
               "${ATTNSTATE_NCCL_LIBRARY})")
