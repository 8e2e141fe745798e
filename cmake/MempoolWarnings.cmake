# mempool_warnings(<target>): the warning set for mempool's own code.
function(mempool_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow
                         -Wstrict-prototypes -Wmissing-prototypes)
  if(MEMPOOL_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# mempool_test_warnings(<target>): tests use Criterion's macros, which do not
# declare prototypes; everything else applies.
function(mempool_test_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(MEMPOOL_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
