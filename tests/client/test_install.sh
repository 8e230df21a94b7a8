#!/usr/bin/env bash
# The installed shared library, as a program outside this tree uses it: `cmake --install` into a scratch
# prefix, then a C program built with nothing but `pkg-config carls-client` (so kb_ffi.h must stand alone
# and the .pc file must point at the prefix it was installed to) calls it. Exits 77 (skipped) in a
# sanitizer build, whose library needs the sanitizer runtime in the program.
# Usage: test_install.sh BUILD_DIR SANITIZE(ON|OFF)
set -euo pipefail
build=$1
if [ "${2:-OFF}" = "ON" ]; then
  echo "skipped: a sanitizer build's library needs its runtime in the program"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
pc_dir=$(dirname "$(find "$tmp/prefix" -name carls-client.pc)")
cat >"$tmp/use.c" <<'C'
#include <kb_ffi.h>
#include <stdio.h>
#include <string.h>
int main(void)
{
    char err[256] = "";
    if (kb_ffi_open("", 0, 0, NULL, NULL, err, sizeof err) != NULL || !strstr(err, "no endpoint")) {
        fprintf(stderr, "kb_ffi_open(\"\") did not fail as it should: '%s'\n", err);
        return 1;
    }
    kb_ffi_t *h = kb_ffi_open("tcp://127.0.0.1:1", 100, 0, NULL, NULL, err, sizeof err);
    if (!h || strcmp(kb_ffi_status_name(4), "NOT_FOUND") != 0 || kb_ffi_shards(h) != 1) {
        fprintf(stderr, "the installed library misbehaves: %s\n", err);
        return 1;
    }
    kb_ffi_close(&h);
    printf("ok: the installed libcarls_client works from a program built with pkg-config\n");
    return 0;
}
C
flags=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs carls-client)
echo "pkg-config carls-client: $flags"
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/use" "$tmp/use.c" $flags
LD_LIBRARY_PATH=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --variable=libdir carls-client) "$tmp/use"
