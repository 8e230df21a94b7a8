# CURVE authentication support. kb_auth.c (in carls_common, so clients and the server share it) needs only libzmq;
# this file adds the key tool.
add_executable(kb-keygen ${CMAKE_CURRENT_SOURCE_DIR}/keygen_main.c)
target_link_libraries(kb-keygen PRIVATE carls_kb)
