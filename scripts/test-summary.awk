# One closing line for a whole test run: the tests cargo's harnesses and
# pytest counted, and every test target that failed, harness or not.
#
# A test binary without libtest's harness (collectives/tests/no_alloc.rs)
# prints no "test result:" line, so counting results alone reported
# "0 failed" for a run that failed. Cargo names every target that exited
# non-zero ("error: test failed, to rerun pass `-p X --test Y`"), and pytest
# prints its own totals; both are counted here.
#
# Input: the run's log, and optionally -v stages="tier 3=101,python=0": the
# exit status of each stage, so that a stage that failed without naming a
# target (a build error) is named as one. Output: "tests: P passed, F
# failed[, S skipped]", then "; failing targets: N (...)" when any failed.
# Exit status 1 when F or N is not zero, so that the line and the status
# cannot disagree.

/^test result:/ {
  passed += $4; failed += $6; skipped += $8
  next
}

/^error: test failed, to rerun pass `/ {
  t = $0
  sub(/^error: test failed, to rerun pass `/, "", t)
  sub(/`.*$/, "", t)
  targets[++ntargets] = t
  next
}

# pytest's totals: "=== 3 failed, 20 passed, 1 skipped in 9.1s ===" or "26 passed in 3.2s".
/^(=+ )?[0-9]+ (passed|failed|errors?|skipped)[ ,]/ {
  for (k = 1; k < NF; k++) {
    if ($(k + 1) ~ /^passed/) passed += $k
    if ($(k + 1) ~ /^failed/) { failed += $k; py_failed = 1 }
    if ($(k + 1) ~ /^errors?/) { failed += $k; py_failed = 1 }
    if ($(k + 1) ~ /^skipped/) skipped += $k
  }
  if (py_failed) targets[++ntargets] = "python tests"
  py_failed = 0
}

END {
  if (!ntargets && stages != "") {
    n = split(stages, st, ",")
    for (i = 1; i <= n; i++) {
      split(st[i], kv, "=")
      if (kv[2] != 0) targets[++ntargets] = kv[1] " (exit " kv[2] ")"
    }
  }
  line = sprintf("tests: %d passed, %d failed", passed, failed)
  if (skipped) line = line sprintf(", %d skipped", skipped)
  if (ntargets) {
    list = targets[1]
    for (i = 2; i <= ntargets; i++) list = list ", " targets[i]
    line = line sprintf("; failing targets: %d (%s)", ntargets, list)
  }
  print line
  exit (failed || ntargets) ? 1 : 0
}
