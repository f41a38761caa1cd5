// Package interop checks the wire protocol against an independent
// implementation: Python's msgpack (Debian python3-msgpack, run as
// /usr/bin/python3) and, for v2 compression, python3-zstandard.
//
// interop.py encodes every agent message type the way a Python agent would
// and the Go decoder must accept each with the same values; the Go encoder's
// output for every supervisor message type must decode in Python to the
// same values. Without the Python modules the tests skip, except under
// CI=true, where they fail: CI installs python3-msgpack and
// python3-zstandard.
package interop
