# install() rules and the exported CMake package: find_package(attnstate CONFIG REQUIRED)
# then link attnstate::attnstate (or attnstate::core, ::cpu, ::cuda, ::testing).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ATTNSTATE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/attnstate)
get_property(ATTNSTATE_EXPORTED_TARGETS GLOBAL PROPERTY ATTNSTATE_EXPORTED_TARGETS)

# The testing kit, when built, goes to its own export file (attnstateTestingTargets.cmake): it
# is the only target that needs RapidCheck, and attnstateConfig.cmake loads it only when
# RapidCheck is found (or required, with COMPONENTS testing), so other users never need RapidCheck.
set(ATTNSTATE_PACKAGE_HAS_TESTING OFF)
if(TARGET attnstate_testing)
  set(ATTNSTATE_PACKAGE_HAS_TESTING ON)
  list(REMOVE_ITEM ATTNSTATE_EXPORTED_TARGETS attnstate_testing)
  install(TARGETS attnstate_testing
          EXPORT attnstateTestingTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT attnstateTestingTargets NAMESPACE attnstate:: DESTINATION ${ATTNSTATE_CMAKE_DIR})
endif()

install(TARGETS ${ATTNSTATE_EXPORTED_TARGETS}
        EXPORT attnstateTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/attnstate DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT attnstateTargets NAMESPACE attnstate:: DESTINATION ${ATTNSTATE_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/attnstateConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/attnstateConfig.cmake
                              INSTALL_DESTINATION ${ATTNSTATE_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/attnstateConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/attnstateConfig.cmake ${PROJECT_BINARY_DIR}/attnstateConfigVersion.cmake
        DESTINATION ${ATTNSTATE_CMAKE_DIR})
