#!/bin/sh
echo "tf_glp: 'bazel coverage' is not available offline: @remote_coverage_tools is a local stand-in (third_party/bazel/remote_coverage_tools)." >&2
exit 1
