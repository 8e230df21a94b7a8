/* Helpers of the bank's unit tests (see bank_testlib.h). */
#include "bank_testlib.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kb_table_config.h"

kb_bank_t *bt_open_bank(const kb_bank_options_t *opts)
{
    kb_bank_t *bank = NULL;
    char err[512];
    if (kb_bank_open(opts, &bank, err, sizeof err) != 0)
        fail_msg("open %s: %s", opts->data_dir, err);
    return bank;
}

void bt_create_table(kb_bank_t *bank, const char *name, uint32_t dim)
{
    kb_table_config_t cfg;
    char err[256];
    Carls__TableConfig pc = CARLS__TABLE_CONFIG__INIT;
    pc.dim = dim;
    assert_int_equal(kb_table_config_from_proto(&pc, 4096, &cfg, err, sizeof err), 0);
    kb_commit_t *commit = kb_bank_commit(bank);
    kb_commit_write_begin(commit);
    assert_int_equal(kb_bank_create_table(bank, name, &cfg, false), KB_BANK_OK);
    uint64_t ticket = kb_commit_write_end(commit);
    assert_int_equal(kb_commit_wait_durable(commit, ticket, 10000, err, sizeof err), 0);
}
