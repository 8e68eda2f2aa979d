# Runs one lossy seed of urdma-sim twice in separate processes and requires the same trace hash
# (the "hash" field of its -v line): a failure printed by CI replays bit-identically anywhere.
# The hash covers every datagram's bytes (so every rkey: keys come from a seeded source) and
# every completion; the injected errors put bad, stale and invalidated keys on the wire too.
set(args --seeds 4242 --loss-ppm 20000 --reorder-ppm 20000 --dup-ppm 10000 --corrupt-ppm 5000
         --errors-percent 50 -v)
foreach(run 1 2)
  execute_process(COMMAND ${SIM} ${args} OUTPUT_VARIABLE out${run} RESULT_VARIABLE rc${run})
  string(REGEX MATCH "hash [0-9a-f]+" hash${run} "${out${run}}")
endforeach()
if(NOT hash1 OR NOT hash1 STREQUAL hash2)
  message(FATAL_ERROR "replay differs: '${hash1}' vs '${hash2}'\n${out1}\n${out2}")
endif()
message(STATUS "replay identical: ${hash1}")
