#!/usr/bin/env bash
# Every check of 10-run.sh again, with each task cloned from a snapshot.
KILN_IT_MODE=restore exec "$(dirname "$0")/10-run.sh"
