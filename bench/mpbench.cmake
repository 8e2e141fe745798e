# mpbench: the fragmentation benchmark (included by bench/CMakeLists.txt).
# The parsing, workload, replay, metrics and report code is the static
# library mpbench_core, so that tests/bench/ links the same code.
file(GLOB _mpb_core CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/core/*.c)
add_library(mpbench_core STATIC ${_mpb_core})
# report.html's page (core/report.html.in) compiled in as a byte array, so
# that mpbench writes it with no file beside the executable. Regenerated
# when the page changes; rewritten only when its bytes do.
set(_mpb_tpl ${CMAKE_CURRENT_SOURCE_DIR}/core/report.html.in)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${_mpb_tpl})
file(READ ${_mpb_tpl} _mpb_hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," _mpb_hex "${_mpb_hex}")
string(REGEX REPLACE "((0x..,){24})" "\\1\n" _mpb_hex "${_mpb_hex}")
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/report_html_template.h.tmp
  "/* Generated from core/report.html.in by mpbench.cmake. */\n"
  "static const char mpb_html_template[] = {\n${_mpb_hex}0};\n")
configure_file(${CMAKE_CURRENT_BINARY_DIR}/report_html_template.h.tmp
  ${CMAKE_CURRENT_BINARY_DIR}/report_html_template.h COPYONLY)
target_include_directories(mpbench_core
  PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/core
  PRIVATE ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_BINARY_DIR})
target_link_libraries(mpbench_core PUBLIC mempool_static m)
# jemalloc replaces malloc for the whole process, which the sanitizers'
# interceptors cannot share: the jemalloc baseline is left out of sanitized
# builds.
set(_mpb_je OFF)
if(JEMALLOC_FOUND AND NOT MEMPOOL_SANITIZE)
  set(_mpb_je ON)
  target_link_libraries(mpbench_core PUBLIC PkgConfig::JEMALLOC)
endif()
target_compile_definitions(mpbench_core PRIVATE _GNU_SOURCE
  MPBENCH_HAVE_JEMALLOC=$<BOOL:${_mpb_je}>
  MPBENCH_TRACES_DIR="${MEMPOOL_TRACES_DIR}")
if(MEMPOOL_HAVE_CUDA)
  # cuda_async.c: CUDA's types and enums only; the driver is the one the
  # cuda backend loads at run time.
  target_include_directories(mpbench_core SYSTEM PRIVATE
    ${CUDAToolkit_INCLUDE_DIRS})
endif()
target_compile_definitions(mpbench_core PRIVATE
  MEMPOOL_HAVE_CUDA=$<BOOL:${MEMPOOL_HAVE_CUDA}>)
target_link_libraries(mpbench_core PUBLIC ${CMAKE_DL_LIBS})
mempool_warnings(mpbench_core)
if(MEMPOOL_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
  # Coverage feedback for tests/fuzz's trace reader targets.
  target_compile_options(mpbench_core PRIVATE -fsanitize=fuzzer-no-link)
endif()

add_executable(mpbench ${CMAKE_CURRENT_SOURCE_DIR}/mpbench.c)
target_link_libraries(mpbench PRIVATE mpbench_core)
mempool_warnings(mpbench)
