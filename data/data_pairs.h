/* A user's own two-tower data set: (query, document) pairs from a TSV file, and optionally a file of more
 * candidate documents, in the shape of data_gcide_t (data_gcide.h) so trainer twotower and the word-tower
 * makers take it as they take GCIDE: the documents are its "headwords", the queries their "senses".
 *
 *   pairs:PAIRS.tsv[,CANDIDATES.txt]
 *
 * PAIRS.tsv: one pair a line, QUERY<TAB>DOCUMENT (UTF-8; blank lines skipped). The query is tokenized with
 * data_text's word rule (data_text.h: runs of letters, apostrophes and non-ASCII bytes, ASCII lowercased) and
 * must hold at least one word. The document is the key of its row in the bank: trimmed, ASCII-lowercased, 1 to
 * DATA_GCIDE_MAX_WORD bytes, not starting with '#'. A document's queries are its senses 1, 2, ... in file
 * order (the hold-out draws one of them). Nothing is masked (GCIDE masks the headword in its definitions).
 * CANDIDATES.txt: one document a line (same rules), ranked and embedded like the others but with no query of
 * its own; documents of the pairs may be listed again.
 *
 * Everything is read and checked before anything is returned; an error names the file and the line. */
#ifndef CARLS_DATA_PAIRS_H
#define CARLS_DATA_PAIRS_H

#include "data_gcide.h"

#include <stdbool.h>
#include <stddef.h>

/* True when data names a pairs data set ("pairs:..."). */
bool data_pairs_is_spec(const char *data);

/* Loads spec ("pairs:PAIRS.tsv[,CANDIDATES.txt]"). Caller owns *out (data_gcide_destroy). Returns 0, or -1
 * with the reason in err. */
int data_pairs_load(const char *spec, data_gcide_t **out, char *err, size_t errlen);

#endif
