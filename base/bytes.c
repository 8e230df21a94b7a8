/* Little-endian integers in byte buffers (see bytes.h). */
#include "bytes.h"

void carls_put_le16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

void carls_put_le32(unsigned char *p, uint32_t v)
{
    carls_put_le16(p, (uint16_t)v);
    carls_put_le16(p + 2, (uint16_t)(v >> 16));
}

void carls_put_le64(unsigned char *p, uint64_t v)
{
    carls_put_le32(p, (uint32_t)v);
    carls_put_le32(p + 4, (uint32_t)(v >> 32));
}

uint16_t carls_get_le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

uint32_t carls_get_le32(const unsigned char *p)
{
    return (uint32_t)carls_get_le16(p) | (uint32_t)carls_get_le16(p + 2) << 16;
}

uint64_t carls_get_le64(const unsigned char *p)
{
    return (uint64_t)carls_get_le32(p) | (uint64_t)carls_get_le32(p + 4) << 32;
}
