# CURVE authentication support. kb_auth.c (in carls_kb through the kb_*.c glob) needs only libzmq, which
# carls_kb already links through carls_common; this file adds the key tool.
add_executable(kb-keygen ${CMAKE_CURRENT_SOURCE_DIR}/keygen_main.c)
target_link_libraries(kb-keygen PRIVATE carls_kb)
