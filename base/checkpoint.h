/* Trainer checkpoints: a model kind, a step, named float32 tensors and (optionally) named blobs in one
 * self-checking file.
 *
 * The trainer writes them (carls_ckpt_save_to_dir: DIR/ckpt-<step>.ckpt, then DIR/latest pointing at it,
 * both replaced atomically); knowledge makers read DIR/latest and load the tensors they need. The byte
 * layout is described at the top of checkpoint.c. The reader trusts nothing: it checks the magic, the
 * version, the length, the CRC-32 and every count and shape against hard caps and the file's size before it
 * allocates, and refuses a bad file with a message that says what is wrong.
 *
 * Return convention: 0 on success, a negative CARLS_CKPT_E* code on failure, with a message in err (errlen
 * bytes; err may be NULL). */
#ifndef CARLS_CHECKPOINT_H
#define CARLS_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#define CARLS_CKPT_MAGIC "CARLSCKP" /* 8 bytes, no terminator in the file */
#define CARLS_CKPT_VERSION 1u    /* the format of a checkpoint of tensors only (what every build reads) */
#define CARLS_CKPT_VERSION_BLOBS 2u /* the format of a checkpoint that also holds blobs (checkpoint.c) */
#define CARLS_CKPT_MAX_TENSORS 4096u
#define CARLS_CKPT_MAX_DIMS 8
#define CARLS_CKPT_MAX_NAME 255u                    /* bytes of a tensor name */
#define CARLS_CKPT_MAX_KIND 64u                     /* bytes of the model kind */
#define CARLS_CKPT_MAX_ELEMENTS ((1ull << 31) - 1u) /* per tensor, so sizes fit an int */
#define CARLS_CKPT_MAX_FILE_BYTES (64ull << 30)     /* 64 GiB */
#define CARLS_CKPT_LATEST "latest"                  /* the pointer file's name inside a checkpoint directory */

enum {
    CARLS_CKPT_OK = 0,
    CARLS_CKPT_EIO = -1,        /* open/read/write/fsync/rename failed (errno in the message) */
    CARLS_CKPT_EMAGIC = -2,     /* not a checkpoint: the first 8 bytes are not CARLS_CKPT_MAGIC */
    CARLS_CKPT_EVERSION = -3,   /* a format version this build does not read */
    CARLS_CKPT_ETRUNCATED = -4, /* shorter (or longer) than its header says */
    CARLS_CKPT_ECHECKSUM = -5,  /* CRC-32 mismatch */
    CARLS_CKPT_ELIMIT = -6,     /* a count, name length or shape beyond the caps above */
    CARLS_CKPT_ECORRUPT = -7,   /* inconsistent contents (bad dtype, duplicate name, tensors overrun) */
    CARLS_CKPT_EINVAL = -8,     /* bad arguments from the caller */
};

/* One tensor: row-major float32 data of the given shape. */
typedef struct {
    char *name;                         /* NUL-terminated, 1..CARLS_CKPT_MAX_NAME bytes */
    int ndim;                           /* 1..CARLS_CKPT_MAX_DIMS */
    int64_t dims[CARLS_CKPT_MAX_DIMS];  /* dims[0..ndim-1], each >= 1 */
    int64_t numel;                      /* product of dims */
    float *data;                        /* numel floats, owned by the checkpoint */
} carls_ckpt_tensor_t;

typedef struct carls_ckpt carls_ckpt_t;

/* A new, empty checkpoint of the given model kind (1..CARLS_CKPT_MAX_KIND bytes) and step. Caller owns the
 * result; NULL when kind is invalid. */
carls_ckpt_t *carls_ckpt_new(const char *kind, uint64_t step);

/* Frees the checkpoint and its tensors; accepts NULL and *self_p == NULL; nulls *self_p. */
void carls_ckpt_destroy(carls_ckpt_t **self_p);

/* Adds a copy of data (numel = product of dims floats) under name. EINVAL for an empty, too long or
 * duplicate name, or a shape outside the caps. */
int carls_ckpt_add(carls_ckpt_t *self, const char *name, int ndim, const int64_t *dims, const float *data);

uint64_t carls_ckpt_step(const carls_ckpt_t *self);
const char *carls_ckpt_kind(const carls_ckpt_t *self);
int carls_ckpt_count(const carls_ckpt_t *self);
/* The i-th tensor (0 <= i < count), in the order they were added or stored. */
const carls_ckpt_tensor_t *carls_ckpt_tensor(const carls_ckpt_t *self, int i);
/* The tensor called name, or NULL. */
const carls_ckpt_tensor_t *carls_ckpt_find(const carls_ckpt_t *self, const char *name);
/* For a checkpoint that was read: its CRC-32 and its size in bytes (0 for one built in memory). */
uint32_t carls_ckpt_crc(const carls_ckpt_t *self);
uint64_t carls_ckpt_file_bytes(const carls_ckpt_t *self);

/* Blobs: named byte strings kept beside the tensors, for what exact resumption of a run needs besides the
 * model (a trainer's data order and position, RNG states, the optimiser's step count, the name of the bank
 * snapshot taken at the same step). They are not tensors: carls_ckpt_count, carls_ckpt_tensor and
 * carls_ckpt_find do not see them, so readers that only want the model are unchanged. A name is unique among
 * tensors and blobs together. A checkpoint without blobs is written in format version 1, byte for byte as
 * before; one with blobs in version 2 (which older builds refuse as an unsupported version). */
#define CARLS_CKPT_MAX_BLOBS 256u /* blobs per checkpoint (within CARLS_CKPT_MAX_TENSORS entries in all) */

/* Adds a copy of len (1..CARLS_CKPT_MAX_ELEMENTS) bytes under name. EINVAL for an empty, too long or duplicate
 * name, a length outside the range, or too many entries. */
int carls_ckpt_add_blob(carls_ckpt_t *self, const char *name, const void *data, size_t len);
/* The blob called name (its length in *len when len is not NULL; the bytes are followed by a NUL that is not
 * counted), or NULL when there is none. */
const void *carls_ckpt_blob(const carls_ckpt_t *self, const char *name, size_t *len);
int carls_ckpt_blob_count(const carls_ckpt_t *self);
/* The i-th blob's name (0 <= i < blob count), its length in *len; NULL when i is out of range. */
const char *carls_ckpt_blob_name(const carls_ckpt_t *self, int i, size_t *len);
/* A uint64 as an 8-byte little-endian blob, and back: 0, or ECORRUPT with err naming the blob when it is
 * missing or not 8 bytes. */
int carls_ckpt_add_u64(carls_ckpt_t *self, const char *name, uint64_t value);
int carls_ckpt_get_u64(const carls_ckpt_t *self, const char *name, uint64_t *value, char *err, size_t errlen);
/* A non-empty text (no NUL inside) as a blob; carls_ckpt_text returns it NUL-terminated, or NULL when it is
 * missing or holds a NUL byte. */
int carls_ckpt_add_text(carls_ckpt_t *self, const char *name, const char *text);
const char *carls_ckpt_text(const carls_ckpt_t *self, const char *name);

/* Writes the checkpoint to path atomically (files.h: a temporary file beside it, fsync, rename over path,
 * fsync the directory). On failure the temporary file is removed and path is untouched. */
int carls_ckpt_write(const carls_ckpt_t *self, const char *path, char *err, size_t errlen);

/* Reads and verifies path. On success *out is a new checkpoint the caller owns. */
int carls_ckpt_read(const char *path, carls_ckpt_t **out, char *err, size_t errlen);

/* Reads only the header of path (magic, version 1 or 2, step) into *step, without verifying the rest: a cheap look
 * for progress reports (how far behind a consumer is); carls_ckpt_read is what verifies a file. */
int carls_ckpt_peek_step(const char *path, uint64_t *step, char *err, size_t errlen);

/* Writes DIR/ckpt-<step, 12 digits>.ckpt (creating DIR and its parents if needed), then replaces DIR/latest
 * (a one-line file naming it) atomically. path_out (path_len bytes, may be NULL) receives the file's path. */
int carls_ckpt_save_to_dir(const carls_ckpt_t *self, const char *dir, char *path_out, size_t path_len, char *err,
                           size_t errlen);

/* Resolves DIR/latest into the path of the newest checkpoint (path_out, path_len bytes). The pointer must name
 * a plain file inside DIR (no '/', no "..": anything else is ECORRUPT). */
int carls_ckpt_latest_path(const char *dir, char *path_out, size_t path_len, char *err, size_t errlen);

/* Removes the oldest ckpt-*.ckpt files of DIR so that at most keep (>= 1) remain; never the one latest names.
 * Returns the number removed, or a negative code. */
int carls_ckpt_prune(const char *dir, int keep, char *err, size_t errlen);

/* Short name of a return code ("ok", "bad magic", ...). */
const char *carls_ckpt_strerror(int rc);

#endif
