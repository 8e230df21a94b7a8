/* Helpers of the bank's unit tests that drive a real kb_bank (test_kb_bank_replica, test_kb_journal,
 * test_kb_snapshot): a bank opened or the test failed, and a table created through the write bracket and
 * waited for until durable. Failures are cmocka failures. */
#ifndef CARLS_BANK_TESTLIB_H
#define CARLS_BANK_TESTLIB_H

#include "kb_bank.h"

#include <stdint.h>

/* kb_bank_open with opts; the test fails, naming opts->data_dir and the error, when it cannot. */
kb_bank_t *bt_open_bank(const kb_bank_options_t *opts);

/* Creates embedding table name of dim (every other setting the protocol's default) in one write and waits up
 * to 10 s for it to be durable. */
void bt_create_table(kb_bank_t *bank, const char *name, uint32_t dim);

#endif
