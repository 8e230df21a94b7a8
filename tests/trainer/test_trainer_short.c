/* The real trainer program, end to end, on a small subset: `trainer supervised` with 200 labelled images
 * per class (2,000 images), 20 epochs (evaluated every 5), hidden 128, one OpenBLAS thread (deterministic), on the CPU. It must
 * reach test accuracy >= 0.75 on the full 10,000-image test set (it reaches 0.795), write one metrics row
 * per evaluation and checkpoints that `trainer inspect` verifies, and `trainer inspect` must refuse the newest
 * checkpoint once a byte of it is flipped. Bad usage must exit 2 with a message.
 *
 * Exits 77 (CTest: skipped) with "SKIPPED: ..." when dataset-fashion-mnist is not installed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define MIN_ACCURACY 0.75

#define CHECK(cond)                                                                                         \
    do {                                                                                                    \
        if (!(cond)) {                                                                                      \
            fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);                               \
            exit(1);                                                                                        \
        }                                                                                                   \
    } while (0)

/* Runs cmd through the shell, captures its stdout (and stderr when merged by cmd) into out; returns the exit
 * status. */
static int s_run(const char *cmd, char *out, size_t outlen)
{
    printf("$ %s\n", cmd);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    printf("%s", out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static const char *s_last_line(char *text)
{
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n') {
        text[--n] = '\0';
    }
    char *nl = strrchr(text, '\n');
    return nl ? nl + 1 : text;
}

int main(void)
{
    struct stat st;
    if (stat(FMNIST_DIR, &st) != 0) {
        printf("SKIPPED: %s is missing (Debian package dataset-fashion-mnist not installed)\n", FMNIST_DIR);
        return 77;
    }
    char dir[] = "/tmp/carls_trainer_test_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    static char out[1 << 16];
    char cmd[2048];
    const char *bin = CARLS_BIN_DIR "/trainer";

    snprintf(cmd, sizeof cmd,
             "%s supervised --data fashion-mnist --labels-per-class 200 --label-seed 3 --epochs 20 --eval-every 5 --hidden 128 "
             "--threads 1 --device cpu --ckpt-dir %s/ckpt --log-level warn",
             bin, dir);
    CHECK(s_run(cmd, out, sizeof out) == 0);
    double acc = -1;
    CHECK(sscanf(s_last_line(out), "test_accuracy=%lf", &acc) == 1);
    printf("test accuracy %.4f (threshold %.2f)\n", acc, MIN_ACCURACY);
    CHECK(acc >= MIN_ACCURACY && acc <= 1.0);

    /* metrics.csv: header + one row per epoch, last row's test accuracy is the one printed. */
    char path[1024];
    snprintf(path, sizeof path, "%s/ckpt/metrics.csv", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    char line[1024];
    int rows = 0;
    double last_acc = -1;
    CHECK(fgets(line, sizeof line, f) != NULL);
    CHECK(strncmp(line, "epoch,step,train_loss", 21) == 0);
    while (fgets(line, sizeof line, f)) {
        double e, s, tl, ta, vl, va;
        CHECK(sscanf(line, "%lf,%lf,%lf,%lf,%lf,%lf", &e, &s, &tl, &ta, &vl, &va) == 6);
        last_acc = va;
        rows++;
    }
    fclose(f);
    CHECK(rows == 4);
    CHECK(last_acc > acc - 1e-4 && last_acc < acc + 1e-4);

    /* inspect the directory (its latest checkpoint): 2000 images / 128 per step = 16 steps/epoch, 320 steps. */
    snprintf(cmd, sizeof cmd, "%s inspect %s/ckpt", bin, dir);
    CHECK(s_run(cmd, out, sizeof out) == 0);
    CHECK(strstr(out, "kind: mlp_classifier") != NULL);
    CHECK(strstr(out, "step: 320\n") != NULL);
    CHECK(strstr(out, "enc.0.weight") != NULL && strstr(out, "[128, 784]") != NULL);
    CHECK(strstr(out, "cls.bias") != NULL);

    /* Flip one byte in the middle of the newest checkpoint: inspect must refuse it. */
    snprintf(path, sizeof path, "%s/ckpt/ckpt-000000000320.ckpt", dir);
    f = fopen(path, "r+b");
    CHECK(f != NULL);
    CHECK(fseek(f, 1000, SEEK_SET) == 0);
    int byte = fgetc(f);
    CHECK(byte != EOF);
    CHECK(fseek(f, 1000, SEEK_SET) == 0);
    fputc(byte ^ 0x40, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s inspect %s 2>&1", bin, path);
    CHECK(s_run(cmd, out, sizeof out) == 1);
    CHECK(strstr(out, "checksum mismatch") != NULL);

    /* Bad usage: exit 2 and say why. */
    snprintf(cmd, sizeof cmd, "%s supervised --data mnist 2>&1", bin);
    CHECK(s_run(cmd, out, sizeof out) == 2);
    CHECK(strstr(out, "not supported") != NULL);
    snprintf(cmd, sizeof cmd, "%s supervised --data fashion-mnist --hidden 12,,3 2>&1", bin);
    CHECK(s_run(cmd, out, sizeof out) == 2);
    snprintf(cmd, sizeof cmd, "%s supervised --data fashion-mnist --device tpu 2>&1", bin);
    CHECK(s_run(cmd, out, sizeof out) == 2);
    CHECK(strstr(out, "auto, cpu or cuda") != NULL);

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    printf("trainer end-to-end OK\n");
    return 0;
}
