/* Little-endian integers in byte buffers, whatever the host's byte order: the files this project owns
 * (checkpoints, table exports) store every integer this way. p points at the first byte. */
#ifndef CARLS_BYTES_H
#define CARLS_BYTES_H

#include <stdint.h>

void carls_put_le16(unsigned char *p, uint16_t v);
void carls_put_le32(unsigned char *p, uint32_t v);
void carls_put_le64(unsigned char *p, uint64_t v);

uint16_t carls_get_le16(const unsigned char *p);
uint32_t carls_get_le32(const unsigned char *p);
uint64_t carls_get_le64(const unsigned char *p);

#endif
