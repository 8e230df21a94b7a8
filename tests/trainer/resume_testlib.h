/* Helpers of the trainers' resume tests (test_trainer_resume, test_trainer_resume_tt): files compared and
 * rewritten, a checkpoint directory's latest pointer moved. Failures count as MT_CHECK failures. */
#ifndef CARLS_RESUME_TESTLIB_H
#define CARLS_RESUME_TESTLIB_H

#include <stddef.h>
#include <stdint.h>

/* The whole of a small file (NULL when unreadable; caller frees); *len its size. */
char *rt_slurp(const char *path, size_t *len);

/* Whether a and b are readable, non-empty and equal byte for byte. */
int rt_same_file(const char *a, const char *b);

/* Runs fmt (a shell command with two %s: a and b) through the shell; a failure is a check failure. */
void rt_sh(const char *fmt, const char *a, const char *b);

/* Points dir/latest at the checkpoint of step. */
void rt_point_latest(const char *dir, int step);

/* Copies checkpoint in to out with blob `name` replaced by value (a u64), or every blob left out when drop is
 * set. */
void rt_rewrite(const char *in, const char *out, const char *name, uint64_t value, int drop);

/* Runs build/bin/trainer with args (argv[0] on, NULL-terminated) and then extra (NULL-terminated, may be
 * NULL), output into log; waits up to 2 minutes. Returns its exit status. */
int rt_trainer(const char *const *args, const char *const *extra, const char *log);

/* Whether checkpoints a and b (both readable: a check failure otherwise) hold tensor name with the same
 * number of values but other values. */
int rt_tensor_differs(const char *a, const char *b, const char *name);

#endif
