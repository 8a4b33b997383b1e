# Classifies one compute-sanitizer log (memcheck, racecheck, ...) for scripts/gpu-check.sh.
#
#   awk -f scripts/sanitizer-report.awk LOG   ->  one line: "R N U" (real, nccl, unprinted)
#
# A report is a line "========= <message>" and its indented continuation lines. Reports of CUDA
# API errors ("Program hit <error> ... on CUDA API call to <fn>") raised inside NCCL (the first
# host frame outside libcuda is in libnccl, or a nccl* function) are NCCL's own probing (e.g.
# cudaErrorNoKernelImageForDevice from cudaFuncGetAttributes in ncclCommInitAll) and count as
# nccl. Every other report (memory errors, leaks, races and hazards, API errors of any other
# caller, internal errors) counts as real. The tool's summaries and banners count as neither;
# errors the summary counts beyond the printed reports (--print-limit) count as unprinted, so
# that a report that was never seen cannot pass as noise.

function flush() {
  if (pending != "") frame(pending, "")
  pending = ""
  if (kind == "") return
  if (kind == "api" && decided && in_nccl) nccl++
  else real++
  kind = ""
}

# The module of a host frame line ("... in libnccl.so.2"), or "" when the line names none.
function module_of(line,    m) {
  if (match(line, / in [^ ]+$/)) {
    m = substr(line, RSTART + 4)
    if (m ~ /\.so(\.[0-9]+)*$/ || m ~ /^\//) return m
  }
  return ""
}

# Decides the report's caller from its first host frame outside the CUDA driver and runtime
# (their frames, if any, come first): NCCL's library or one of its nccl* functions.
function frame(text, module) {
  if (decided || module ~ /libcuda(rt)?\.so/) return
  decided = 1
  in_nccl = module ~ /libnccl/ || text ~ /Host Frame: *nccl/
}

BEGIN { real = 0; nccl = 0; summary = -1; kind = ""; pending = "" }

{ sub(/\r$/, "") }

/^========= *$/ { flush(); next }

/^=========  +/ {  # continuation of the current report
  if (kind != "api") next
  if ($0 ~ /Host Frame:/) {
    if (pending != "") frame(pending, "")
    pending = ""
    mod = module_of($0)
    if (mod != "") frame($0, mod)
    else pending = $0
  } else if (pending != "" && $0 ~ /^=+ +in /) {
    sub(/^=+ +in +/, "")
    frame(pending, $0)
    pending = ""
  }
  next
}

/^========= / {  # a new report, a summary or a banner
  flush()
  msg = substr($0, 11)
  if (msg ~ /^ERROR SUMMARY: [0-9]+ error/) {
    split(msg, w, " ")
    summary = w[3] + 0
    next
  }
  if (msg ~ /^(COMPUTE-SANITIZER|RACECHECK SUMMARY|LEAK SUMMARY|Target application returned|Error: process didn.t terminate|This can occur|[0-9]+ errors? (were|was) not (printed|displayed))/) next
  kind = msg ~ /^Program hit / ? "api" : "other"
  decided = 0
  in_nccl = 0
  next
}

END {
  flush()
  unprinted = summary > real + nccl ? summary - real - nccl : 0
  printf "%d %d %d\n", real, nccl, unprinted
}
