#!/usr/bin/env bash
# 70-api on PostgreSQL: the whole kiln-api API suite against the PostgreSQL
# store (a server of the test's own, scripts/pg-local.sh), plus the database
# going away and coming back under the running kiln-api.
KILN_TEST_STORE=postgres exec "$(dirname "$0")/70-api.sh"
