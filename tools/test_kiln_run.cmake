# CTest script for kiln-run (see tools/CMakeLists.txt): cmake -DKILN_RUN=... -DFIXTURE=... -DDIR=... -P
# Each case runs kiln-run and checks its exit status and one substring of its output.
file(REMOVE_RECURSE ${DIR})
execute_process(COMMAND ${FIXTURE} write ${DIR} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln_run_fixture write failed: ${rc}")
endif()

function(expect want_rc want_text)
  execute_process(COMMAND ${KILN_RUN} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${out}${err}" "${want_text}" at)
  if(NOT rc EQUAL want_rc OR at EQUAL -1)
    message(FATAL_ERROR "kiln-run ${ARGN}\n  expected exit ${want_rc} and '${want_text}'\n"
                        "  got exit ${rc}\n  stdout: ${out}\n  stderr: ${err}")
  endif()
  message(STATUS "ok: kiln-run ${ARGN} -> ${rc}")
endfunction()

set(M ${DIR}/mlp-symbol.json)
# Success: default params path, outputs written and equal to the eager result, a timed run.
expect(0 "output0: float32(2, 4)" ${M} --input data=${DIR}/data.npy --output-dir ${DIR}/out)
execute_process(COMMAND ${FIXTURE} compare ${DIR}/out/output0.npy ${DIR}/expected0.npy RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln-run's output0.npy differs from the eager result")
endif()
# Another batch size than the exported one (2): the graph is re-shaped for 5 rows.
expect(0 "output0: float32(5, 4)" ${M} --input data=${DIR}/batch5.npy --output-dir ${DIR}/out5)
execute_process(COMMAND ${FIXTURE} compare ${DIR}/out5/output0.npy ${DIR}/expected_batch5.npy RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln-run's output0.npy at batch 5 differs from the eager result")
endif()
expect(0 "\"bench\": \"kiln_run\", \"case\": \"mlp\", \"metric\": \"us_per_call\""
       ${M} --params ${DIR}/mlp-0000.params --input data=${DIR}/data.npy --repeat 20)

# The same model on the second of two simulated GPUs (KILN_GPU_SIM=2): the eager CPU result again,
# from the compiled graph run on the GPU; a GPU that is not there is kiln's DeviceError.
set(KILN_RUN_ALONE ${KILN_RUN})
set(KILN_RUN ${CMAKE_COMMAND} -E env KILN_GPU_SIM=2 ${KILN_RUN_ALONE})
expect(0 "output0: float32(2, 4)" ${M} --input data=${DIR}/data.npy --output-dir ${DIR}/gpu_out --device gpu:1)
execute_process(COMMAND ${FIXTURE} compare ${DIR}/gpu_out/output0.npy ${DIR}/expected0.npy RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln-run --device gpu:1's output0.npy differs from the eager CPU result")
endif()
expect(0 "output0: float32(5, 4)" ${M} --input data=${DIR}/batch5.npy --output-dir ${DIR}/gpu_out5 --device gpu:1)
execute_process(COMMAND ${FIXTURE} compare ${DIR}/gpu_out5/output0.npy ${DIR}/expected_batch5.npy RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln-run --device gpu:1's output0.npy at batch 5 differs from the eager CPU result")
endif()
expect(0 "\"device\": \"gpu(0)\"" ${M} --input data=${DIR}/data.npy --repeat 5 --device gpu)
expect(1 "gpu(2)" ${M} --input data=${DIR}/data.npy --device gpu:2)
set(KILN_RUN ${KILN_RUN_ALONE})

# Usage errors: exit 2.
expect(2 "no symbol file given")
expect(2 "unknown option '--frobnicate'" ${M} --frobnicate)
expect(2 "--repeat expects an integer >= 1" ${M} --repeat 0)
expect(2 "--device expects cpu" ${M} --device tpu)
expect(2 "--input expects name=file.npy" ${M} --input data)

# Model and input errors: exit 1 with kiln's message.
expect(1 "missing input(s) data: the model expects data=float32(2, 8)" ${M})
expect(1 "the model has no input(s) label" ${M} --input data=${DIR}/data.npy --input label=${DIR}/data.npy)
expect(1 "cannot open '${DIR}/nope-0000.params'" ${M} --params ${DIR}/nope-0000.params --input data=${DIR}/data.npy)
expect(1 "input 'data' expects float32(2, 8), found float32(2, 8, 1)" ${M} --input data=${DIR}/wrongshape.npy)
expect(1 "input 'data' expects float32(2, 8), found int64(2, 8)" ${M} --input data=${DIR}/int64.npy)
expect(1 "Fortran-order" ${M} --input data=${DIR}/fortran.npy)
expect(1 "big-endian" ${M} --input data=${DIR}/bigendian.npy)
expect(1 "is truncated" ${M} --input data=${DIR}/truncated.npy)
expect(1 "cannot open '${DIR}/absent.npy'" ${M} --input data=${DIR}/absent.npy)
file(WRITE ${DIR}/bad-symbol.json "{\"format\": \"kiln-graph\"")
expect(1 "bad-symbol.json" ${DIR}/bad-symbol.json --params ${DIR}/mlp-0000.params --input data=${DIR}/data.npy)
