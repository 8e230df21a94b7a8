# Prometheus metrics over HTTP (kb_metrics.c, kb-server --metrics-port): libmicrohttpd from Debian
# (libmicrohttpd-dev). PUBLIC: carls_kb is static, so its users link the library too.
pkg_check_modules(MHD REQUIRED IMPORTED_TARGET libmicrohttpd)
target_link_libraries(carls_kb PUBLIC PkgConfig::MHD)
