/* Unit tests of the GCIDE reverse-dictionary pieces: the article parser on real articles (copied from
 * Debian's dict-gcide), masking, dictd base-64, the loader on a small hand-made dictionary (plain and
 * gzip), hold-out by seed and by file, the ranking metrics and the TF-IDF baseline on a hand-built data set. */
#include "data_gcide.h"
#include "trainer_rank.h"
#include "trainer_tfidf.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>
#include "test_main.h"

/* ---- real articles (Abandon's Usage paragraph shortened) ---- */

static const char ABANDON_VT[] =
    "Abandon \\A*ban\"don\\ ([.a]*b[a^]n\"d[u^]n), v. t. [imp. & p. p.\n"
    "   {Abandoned} (-d[u^]nd); p. pr. & vb. n. {Abandoning}.] [OF.\n"
    "   abandoner, F. abandonner; a (L. ad) + bandon permission,\n"
    "   authority, LL. bandum, bannum, public proclamation,\n"
    "   interdiction, bannire to proclaim, summon: of Germanic\n"
    "   origin; cf. Goth. bandwjan to show by signs, to designate\n"
    "   OHG. ban proclamation. The word meant to proclaim, put under\n"
    "   a ban, put under control; hence, as in OE., to compel,\n"
    "   subject, or to leave in the control of another, and hence, to\n"
    "   give up. See {Ban}.]\n"
    "   1. To cast or drive out; to banish; to expel; to reject.\n"
    "      [Obs.]\n"
    "      [1913 Webster]\n"
    "\n"
    "            That he might . . . abandon them from him. --Udall.\n"
    "      [1913 Webster]\n"
    "\n"
    "            Being all this time abandoned from your bed. --Shak.\n"
    "      [1913 Webster]\n"
    "\n"
    "   2. To give up absolutely; to forsake entirely; to renounce\n"
    "      utterly; to relinquish all connection with or concern on;\n"
    "      to desert, as a person to whom one owes allegiance or\n"
    "      fidelity; to quit; to surrender.\n"
    "      [1913 Webster]\n"
    "\n"
    "            Hope was overthrown, yet could not be abandoned.\n"
    "                                                  --I. Taylor.\n"
    "      [1913 Webster]\n"
    "\n"
    "   3. Reflexively: To give (one's self) up without attempt at\n"
    "      self-control; to yield (one's self) unrestrainedly; --\n"
    "      often in a bad sense.\n"
    "      [1913 Webster]\n"
    "\n"
    "            He abandoned himself . . . to his favorite vice.\n"
    "                                                  --Macaulay.\n"
    "      [1913 Webster]\n"
    "\n"
    "   4. (Mar. Law) To relinquish all claim to; -- used when an\n"
    "      insured person gives up to underwriters all claim to the\n"
    "      property covered by a policy, which may remain after loss\n"
    "      or damage by a peril insured against.\n"
    "      [1913 Webster]\n"
    "\n"
    "   Syn: To give up; yield; forego; cede; surrender; resign;\n"
    "        abdicate; quit; relinquish; renounce; desert; forsake;\n"
    "        leave; retire; withdraw from.\n"
    "\n"
    "   Usage: {To Abandon}, {Desert}, {Forsake}. These words agree\n"
    "          in representing a person as giving up or leaving some\n"
    "          object, but differ as to the mode of doing it. The\n"
    "          distinctive sense of abandon is that of giving up a\n"
    "          [1913 Webster]\n";

static const char BANK_N[] =
    "Bank \\Bank\\ (b[a^][ng]k), n. [OE. banke; akin to E. bench, and\n"
    "   prob. of Scand. origin; cf. Icel. bakki. See {Bench}.]\n"
    "   1. A mound, pile, or ridge of earth, raised above the\n"
    "      surrounding level; hence, anything shaped like a mound or\n"
    "      ridge of earth; as, a bank of clouds; a bank of snow.\n"
    "      [1913 Webster]\n"
    "\n"
    "            They cast up a bank against the city. --2 Sam. xx.\n"
    "                                                  15.\n"
    "      [1913 Webster]\n"
    "\n"
    "   2. A steep acclivity, as the slope of a hill, or the side of\n"
    "      a ravine.\n"
    "      [1913 Webster]\n"
    "\n"
    "   3. The margin of a watercourse; the rising ground bordering a\n"
    "      lake, river, or sea, or forming the edge of a cutting, or\n"
    "      other hollow.\n"
    "      [1913 Webster]\n"
    "\n"
    "            Tiber trembled underneath her banks.  --Shak.\n"
    "      [1913 Webster]\n"
    "\n"
    "   4. An elevation, or rising ground, under the sea; a shoal,\n"
    "      shelf, or shallow; as, the banks of Newfoundland.\n"
    "      [1913 Webster]\n"
    "\n"
    "   5. (Mining)\n"
    "      (a) The face of the coal at which miners are working.\n"
    "      (b) A deposit of ore or coal, worked by excavations above\n"
    "          water level.\n"
    "      (c) The ground at the top of a shaft; as, ores are brought\n"
    "          to bank.\n"
    "          [1913 Webster]\n"
    "\n"
    "   6. (A[\"e]ronautics) The lateral inclination of an\n"
    "      a[\"e]roplane as it rounds a curve; as, a bank of 45[deg]\n"
    "      is easy; a bank of 90[deg] is dangerous.\n"
    "      [Webster 1913 Suppl.]\n"
    "\n"
    "   7. A group or series of objects arranged near together; as, a\n"
    "      bank of electric lamps, etc.\n"
    "      [Webster 1913 Suppl.]\n"
    "\n"
    "   8. The tilt of a roadway or railroad, at a curve in the road,\n"
    "      designed to counteract centrifugal forces acting on\n"
    "      vehicles moving rapiudly around the curve, thus reducing\n"
    "      the danger of overturning during a turn.\n"
    "      [PJC]\n"
    "\n"
    "   {Bank beaver} (Zool.), the otter. [Local, U.S.]\n"
    "\n"
    "   {Bank swallow}, a small American and European swallow\n"
    "      ({Clivicola riparia}) that nests in a hole which it\n"
    "      excavates in a bank.\n"
    "      [1913 Webster]\n";

static const char QUIXOTIC[] =
    "Quixotic \\Quix*ot\"ic\\ (kw[i^]ks*[o^]t\"[i^]k), a.\n"
    "   1. Like Don Quixote; romantic to extravagance; prone to\n"
    "      pursue unrealizable goals; absurdly chivalric; apt to be\n"
    "      deluded. See also {quixotism}. \"Feats of quixotic\n"
    "      gallantry.\" --Prescott.\n"
    "      [1913 Webster]\n"
    "\n"
    "   2. Like the deeds of Don Quixote; ridiculously impractical;\n"
    "      unachievable; extravagantly romantic; doomed to failure;\n"
    "      as, a quixotic quest.\n"
    "      [PJC]\n"
    "\n"
    "            The word \"quixotic\" . . . has entered the common\n"
    "            language, with the meaning \"hopelessly naive and\n"
    "            idealistic,\" \"ridiculously impractical,\" \"doomed to\n"
    "            fail.\" That this epithet can be used now in an\n"
    "            exclusively pejorative sense not only shows that we\n"
    "            have ceased to read Cervantes and to understand his\n"
    "            character, but more fundamentally it reveals that\n"
    "            our culture has drifted away from its spiritual\n"
    "            roots.                                --Simon Leys\n"
    "                                                  (N. Y. Review\n"
    "                                                  of Books, June\n"
    "                                                  11, 1998, p.\n"
    "                                                  35)\n"
    "      [PJC]\n";

static const char AIT[] =
    "Ait \\Ait\\, n. [AS. ?, ?, perh. dim. of [imac]eg, [imac]g,\n"
    "   island. See {Eyot}.]\n"
    "   An islet, or little isle, in a river or lake; an eyot.\n"
    "   [1913 Webster]\n"
    "\n"
    "         The ait where the osiers grew.           --R. Hodges\n"
    "                                                  (1649).\n"
    "   [1913 Webster]\n"
    "\n"
    "         Among green aits and meadows.            --Dickens.\n"
    "   [1913 Webster]\n";

static const char BANC[] =
    "Banc \\Banc\\, Bancus \\Ban\"cus\\, Bank \\Bank\\, n. [OF. banc, LL.\n"
    "   bancus. See {Bank}, n.]\n"
    "   A bench; a high seat, or seat of distinction or judgment; a\n"
    "   tribunal or court.\n"
    "   [1913 Webster]\n"
    "\n"
    "   {In banc}, {In banco} (the ablative of bancus), {In bank}, in\n"
    "      full court, or with full judicial authority; as, sittings\n"
    "      in banc (distinguished from sittings at {nisi prius}).\n"
    "      [1913 Webster]\n";

static const char ABRUPTLY[] =
    "Abruptly \\Ab*rupt\"ly\\, adv.\n"
    "   1. In an abrupt manner; without giving notice, or without the\n"
    "      usual forms; suddenly.\n"
    "      [1913 Webster]\n"
    "\n"
    "   2. Precipitously.\n"
    "      [1913 Webster] Abruptly pinnate\n";

/* ---- helpers ---- */

typedef struct {
    char *senses[64];
    size_t n;
} s_senses_t;

static void s_collect(void *ctx, const char *text, size_t len)
{
    s_senses_t *s = ctx;
    assert_true(s->n < 64);
    s->senses[s->n] = strndup(text, len);
    s->n++;
}

/* Parses article and checks its senses are exactly expect[0..n). */
static void s_expect_senses(const char *article, const char *const *expect, size_t n)
{
    s_senses_t got = {0};
    size_t count = data_gcide_article_senses(article, strlen(article), s_collect, &got);
    assert_int_equal(count, got.n);
    for (size_t i = 0; i < got.n && i < n; i++)
        assert_string_equal(got.senses[i], expect[i]);
    assert_int_equal(got.n, n);
    for (size_t i = 0; i < got.n; i++)
        free(got.senses[i]);
}

/* The tokens of line `line` of t, space-separated. */
static void s_line_text(const data_text_t *t, size_t line, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t k = t->line_start[line]; k < t->line_start[line + 1]; k++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%.*s", o ? " " : "", (int)t->tok_len[k], data_text_token(t, k));
}

/* A data set built by hand: entries "word:definition", sorted by word, senses of a word consecutive. */
static data_gcide_t *s_make(const char *const *entries, size_t n)
{
    data_gcide_t *g = calloc(1, sizeof *g);
    g->words = calloc(n, sizeof *g->words);
    g->senses = calloc(n, sizeof *g->senses);
    g->word_first_sense = calloc(n + 1, sizeof *g->word_first_sense);
    char *text = calloc(1, 1 << 16);
    for (size_t i = 0; i < n; i++) {
        const char *colon = strchr(entries[i], ':');
        assert_non_null(colon);
        size_t wl = (size_t)(colon - entries[i]);
        if (g->n_words == 0 || strlen(g->words[g->n_words - 1]) != wl ||
            strncmp(g->words[g->n_words - 1], entries[i], wl) != 0) {
            g->words[g->n_words++] = strndup(entries[i], wl);
        }
        uint32_t w = (uint32_t)g->n_words - 1;
        uint32_t number = i && g->senses[i - 1].word == w ? g->senses[i - 1].number + 1 : 1;
        g->senses[g->n_senses++] = (data_gcide_sense_t){w, number, false};
        g->word_first_sense[w + 1] = g->n_senses;
        strcat(text, colon + 1);
        strcat(text, "\n");
    }
    char err[128];
    assert_int_equal(data_text_from_buffer(text, strlen(text), &g->text, err, sizeof err), 0);
    assert_int_equal(g->text->n_lines, g->n_senses);
    free(text);
    return g;
}

/* ---- parser ---- */

static void test_parse_numbered_with_quotations(void **state)
{
    (void)state;
    static const char *const expect[] = {
        "To cast or drive out; to banish; to expel; to reject.",
        "To give up absolutely; to forsake entirely; to renounce utterly; to relinquish all connection with or "
        "concern on; to desert, as a person to whom one owes allegiance or fidelity; to quit; to surrender.",
        "Reflexively: To give (one's self) up without attempt at self-control; to yield (one's self) "
        "unrestrainedly; -- often in a bad sense.",
        "(Mar. Law) To relinquish all claim to; -- used when an insured person gives up to underwriters all claim "
        "to the property covered by a policy, which may remain after loss or damage by a peril insured against.",
    };
    s_expect_senses(ABANDON_VT, expect, 4);
}

static void test_parse_sub_senses_and_sub_entries(void **state)
{
    (void)state;
    static const char *const expect[] = {
        "A mound, pile, or ridge of earth, raised above the surrounding level; hence, anything shaped like a "
        "mound or ridge of earth; as, a bank of clouds; a bank of snow.",
        "A steep acclivity, as the slope of a hill, or the side of a ravine.",
        "The margin of a watercourse; the rising ground bordering a lake, river, or sea, or forming the edge of "
        "a cutting, or other hollow.",
        "An elevation, or rising ground, under the sea; a shoal, shelf, or shallow; as, the banks of "
        "Newfoundland.",
        "(Mining) (a) The face of the coal at which miners are working. (b) A deposit of ore or coal, worked by "
        "excavations above water level. (c) The ground at the top of a shaft; as, ores are brought to bank.",
        "(Aeronautics) The lateral inclination of an aeroplane as it rounds a curve; as, a bank of 45 is easy; "
        "a bank of 90 is dangerous.",
        "A group or series of objects arranged near together; as, a bank of electric lamps, etc.",
        "The tilt of a roadway or railroad, at a curve in the road, designed to counteract centrifugal forces "
        "acting on vehicles moving rapiudly around the curve, thus reducing the danger of overturning during a "
        "turn.",
    };
    s_expect_senses(BANK_N, expect, 8);
}

static void test_parse_pjc_and_inline_quotation(void **state)
{
    (void)state;
    /* Sense 1 ends with a quotation and its citation inside the sense: both go. */
    static const char *const expect[] = {
        "Like Don Quixote; romantic to extravagance; prone to pursue unrealizable goals; absurdly chivalric; apt "
        "to be deluded. See also quixotism.",
        "Like the deeds of Don Quixote; ridiculously impractical; unachievable; extravagantly romantic; doomed "
        "to failure; as, a quixotic quest.",
    };
    s_expect_senses(QUIXOTIC, expect, 2);
}

static void test_parse_unnumbered(void **state)
{
    (void)state;
    static const char *const ait[] = {"An islet, or little isle, in a river or lake; an eyot."};
    s_expect_senses(AIT, ait, 1);
    /* Three names in the header; the {In banc} sub-entry paragraph is not a sense. */
    static const char *const banc[] = {"A bench; a high seat, or seat of distinction or judgment; a tribunal or "
                                       "court."};
    s_expect_senses(BANC, banc, 1);
    /* The debris after a tag ("[1913 Webster] Abruptly pinnate") is dropped. */
    static const char *const abruptly[] = {
        "In an abrupt manner; without giving notice, or without the usual forms; suddenly.", "Precipitously."};
    s_expect_senses(ABRUPTLY, abruptly, 2);
    const char *header_only = "Foo \\Foo\\, n. [Obs.]\n";
    assert_int_equal(data_gcide_article_senses(header_only, strlen(header_only), NULL, NULL), 0);
    const char *codes = "Oe \\Oe\\, n.\n   The [ae]on of Gr[ae]cia; a [beta]-ray [R.] [Local,\n   U.S.] aft.\n";
    static const char *const decoded[] = {"The aeon of Graecia; a beta -ray aft."};
    s_expect_senses(codes, decoded, 1);
    /* A run-in derivative ends the definition; syllable marks inside braces go. */
    const char *run_in = "Equidistant \\E`qui*dis\"tant\\, a. [L. aequidistans, -antis;\n"
                         "   aequus equal + distans distant: cf. F. ['e]quidistant.]\n"
                         "   Being at an equal distance from the same point or {thing}. --\n"
                         "   {E`qui*dis\"tant*ly}, adv. --Sir T. Browne.\n"
                         "   [1913 Webster]\n";
    static const char *const run_in_senses[] = {"Being at an equal distance from the same point or thing."};
    s_expect_senses(run_in, run_in_senses, 1);
    const char *marks = "Bird \\Bird\\, n.\n   Called also {Gre*ga\"ri*ous} birds. [Obs.]\n";
    static const char *const marks_senses[] = {"Called also Gregarious birds."};
    s_expect_senses(marks, marks_senses, 1);
}

/* ---- masking ---- */

static void test_mask(void **state)
{
    (void)state;
    static const struct {
        const char *headword, *text;
        size_t masked; /* words taken out */
        const char *want;
    } cases[] = {
        {"abandon", "to abandon one's abandonment and abandoned friends aband", 4, "to one's and friends"},
        /* Shorter than five letters: only words starting with the headword. */
        {"bank", "the bank banks banker's embankment ban", 3, "the embankment ban"},
        {"ait", "bait ait aits", 2, "bait"},
        /* Five letters shared is enough: "quixote" goes with "quixotic", "quick" stays. */
        {"quixotic", "like don quixote quick", 1, "like don quick"},
        {"bank", "bank banks", 2, ""},
        {"tree", "", 0, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[256];
        assert_int_equal(data_gcide_mask(cases[i].headword, cases[i].text, out), cases[i].masked);
        assert_string_equal(out, cases[i].want);
    }
}

/* ---- base 64 ---- */

static void test_b64(void **state)
{
    (void)state;
    assert_int_equal(data_gcide_b64("A", 1), 0);
    assert_int_equal(data_gcide_b64("B", 1), 1);
    assert_int_equal(data_gcide_b64("/", 1), 63);
    assert_int_equal(data_gcide_b64("BA", 2), 64);
    assert_int_equal(data_gcide_b64("Jyg", 3), 9 * 4096 + 50 * 64 + 32);
    assert_int_equal(data_gcide_b64("Bs2ZW", 5), ((((1 * 64 + 44) * 64 + 54) * 64 + 25) * 64 + 22));
    assert_int_equal(data_gcide_b64("Jygxx", 3), 9 * 4096 + 50 * 64 + 32); /* only len bytes read */
    assert_int_equal(data_gcide_b64("J-g", 3), -1);
    assert_int_equal(data_gcide_b64("", 0), -1);
    assert_int_equal(data_gcide_b64("//////////", 10), (int64_t)((1ull << 60) - 1));
    assert_int_equal(data_gcide_b64("///////////", 11), -1); /* 66 bits */
}

/* ---- the loader on a hand-made dictionary ---- */

static void s_b64(uint64_t v, char *out)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char tmp[16];
    int n = 0;
    do {
        tmp[n++] = digits[v & 63];
        v >>= 6;
    } while (v);
    for (int i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    out[n] = '\0';
}

static const char BANK_VT[] = "Bank \\Bank\\, v. t. [imp. & p. p. {Banked}; p. pr. & vb. n.\n"
                              "   {Banking}.]\n"
                              "   1. To raise a mound or dike about; to embank.\n"
                              "      [1913 Webster]\n"
                              "\n"
                              "   2. To heap or pile up; as, to bank sand.\n"
                              "      [1913 Webster]\n";
static const char BANK_VT2[] = "Bank \\Bank\\, v. t.\n"
                               "   To deposit in a bank. --Johnson.\n"
                               "   [1913 Webster]\n";
static const char BANKS[] = "Banks \\Banks\\, n.\n"
                            "   Banks; banksia.\n";

/* Writes the dictionary (gzip when gz) and its index into dir. */
static void s_write_dict(const char *dir, bool gz, char *index_path, char *dict_path, const char *bad_line)
{
    const char *arts[] = {BANC, BANK_VT, BANK_VT2, BANKS, AIT};
    uint64_t off[5], len[5], pos = 0;
    sprintf(dict_path, "%s/test.dict%s", dir, gz ? ".dz" : "");
    sprintf(index_path, "%s/test.index", dir);
    gzFile zf = gz ? gzopen(dict_path, "wb") : NULL;
    FILE *pf = gz ? NULL : fopen(dict_path, "wb");
    for (int i = 0; i < 5; i++) {
        off[i] = pos;
        len[i] = strlen(arts[i]);
        pos += len[i];
        if (gz)
            assert_int_equal(gzwrite(zf, arts[i], (unsigned)len[i]), (int)len[i]);
        else
            assert_int_equal(fwrite(arts[i], 1, len[i], pf), len[i]);
    }
    if (gz)
        gzclose(zf);
    else
        fclose(pf);
    /* dictd's order: sorted by headword. "Banked" points at the verb, "Bancus" at Banc's article. */
    static const struct {
        const char *word;
        int art;
    } lines[] = {{"00-database-info", 4}, {"Ait", 4}, {"Banc", 0}, {"Bancus", 0}, {"Bank", 0}, {"Bank", 1},
                 {"Bank", 2}, {"Banked", 1}, {"Banks", 3}, {"bank", 2}, {"eye-shadow", 1}};
    FILE *f = fopen(index_path, "w");
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        char o[16], l[16];
        s_b64(off[lines[i].art], o);
        s_b64(len[lines[i].art], l);
        fprintf(f, "%s\t%s\t%s\n", lines[i].word, o, l);
    }
    if (bad_line)
        fprintf(f, "%s\n", bad_line);
    fclose(f);
}

static void s_expect_sense(const data_gcide_t *g, const char *word, uint32_t number, const char *tokens)
{
    long w = data_gcide_find(g, word);
    assert_true(w >= 0);
    size_t s = g->word_first_sense[w] + number - 1;
    assert_true(s < g->word_first_sense[w + 1]);
    assert_int_equal(g->senses[s].number, number);
    char buf[512];
    s_line_text(g->text, s, buf, sizeof buf);
    assert_string_equal(buf, tokens);
}

static void test_load_small(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_gcide_XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (int gz = 0; gz <= 1; gz++) {
        char index_path[256], dict_path[256], err[512];
        s_write_dict(dir, gz, index_path, dict_path, NULL);
        data_gcide_t *g = NULL;
        assert_int_equal(data_gcide_load(index_path, dict_path, &g, err, sizeof err), 0);
        /* banc owns the article it shares with bancus and bank; bank owns its verbs (banked does not);
         * banks's only definition masks to nothing; non-letter headwords are skipped. */
        assert_int_equal(g->n_words, 3);
        assert_string_equal(g->words[0], "ait");
        assert_string_equal(g->words[1], "banc");
        assert_string_equal(g->words[2], "bank");
        assert_int_equal(data_gcide_find(g, "banked"), -1);
        assert_int_equal(data_gcide_find(g, "bancus"), -1);
        assert_int_equal(data_gcide_find(g, "banks"), -1);
        assert_int_equal(g->n_senses, 5);
        assert_int_equal(g->text->n_lines, 5);
        s_expect_sense(g, "ait", 1, "an islet or little isle in a river or lake an eyot");
        s_expect_sense(g, "banc", 1, "a bench a high seat or seat of distinction or judgment a tribunal or court");
        s_expect_sense(g, "bank", 1, "to raise a mound or dike about to embank");
        s_expect_sense(g, "bank", 2, "to heap or pile up as to sand");
        s_expect_sense(g, "bank", 3, "to deposit in a");
        assert_int_equal(g->word_first_sense[3], 5);
        assert_int_equal(g->stats.index_lines, 11);
        assert_int_equal(g->stats.senses_parsed, 6);
        assert_int_equal(g->stats.senses_with_headword, 3);
        assert_int_equal(g->stats.senses_masked_empty, 1);
        data_gcide_destroy(&g);
        assert_null(g);
    }
    char index_path[256], dict_path[256], err[512];
    s_write_dict(dir, false, index_path, dict_path, "Zebra\tA\tZZZZ");
    data_gcide_t *g = NULL;
    assert_int_equal(data_gcide_load(index_path, dict_path, &g, err, sizeof err), -1);
    assert_null(g);
    assert_non_null(strstr(err, "test.index:12:"));
    s_write_dict(dir, false, index_path, dict_path, "Zebra\tA-\tB");
    assert_int_equal(data_gcide_load(index_path, dict_path, &g, err, sizeof err), -1);
    assert_non_null(strstr(err, "test.index:12:"));
    assert_int_equal(data_gcide_load("/nonexistent/gcide.index", dict_path, &g, err, sizeof err), -1);
    assert_non_null(strstr(err, "dict-gcide"));
    assert_int_equal(data_gcide_load(index_path, "/nonexistent/gcide.dict.dz", &g, err, sizeof err), -1);
    assert_non_null(strstr(err, "dict-gcide"));
    data_gcide_destroy(&g);
    unlink(index_path);
    unlink(dict_path);
    sprintf(dict_path, "%s/test.dict.dz", dir);
    unlink(dict_path);
    rmdir(dir);
}

/* ---- hold-out ---- */

/* 60 headwords "aa".."ch" with 1 to 4 senses each. */
static data_gcide_t *s_make_many(void)
{
    static char buf[240][48];
    const char *entries[240];
    size_t n = 0;
    for (int w = 0; w < 60; w++) {
        for (int k = 0; k <= w % 4; k++) {
            snprintf(buf[n], sizeof buf[n], "%c%c:meaning %c%c number %c", 'a' + w / 26, 'a' + w % 26,
                     'a' + w / 26, 'a' + w % 26, 'a' + k);
            entries[n] = buf[n];
            n++;
        }
    }
    return s_make(entries, n);
}

static size_t s_held_of_word(const data_gcide_t *g, size_t w)
{
    size_t n = 0;
    for (size_t s = g->word_first_sense[w]; s < g->word_first_sense[w + 1]; s++)
        n += g->senses[s].held_out;
    return n;
}

static void s_holdout_flags(const data_gcide_t *g, bool *flags)
{
    for (size_t s = 0; s < g->n_senses; s++)
        flags[s] = g->senses[s].held_out;
}

static void test_holdout_seed(void **state)
{
    (void)state;
    data_gcide_t *g = s_make_many();
    char err[256];
    bool a[256], b[256];
    assert_int_equal(data_gcide_holdout_seed(g, 7, 20, err, sizeof err), 0);
    assert_int_equal(g->n_held_out, 20);
    size_t total = 0;
    for (size_t w = 0; w < g->n_words; w++) {
        size_t held = s_held_of_word(g, w);
        size_t senses = g->word_first_sense[w + 1] - g->word_first_sense[w];
        assert_true(held <= 1);
        if (held)
            assert_true(senses >= 2); /* keeps >= 1 training sense */
        total += held;
    }
    assert_int_equal(total, 20);
    s_holdout_flags(g, a);
    /* Deterministic, and a second call replaces the first. */
    assert_int_equal(data_gcide_holdout_seed(g, 8, 20, err, sizeof err), 0);
    s_holdout_flags(g, b);
    assert_true(memcmp(a, b, g->n_senses * sizeof *a) != 0);
    assert_int_equal(data_gcide_holdout_seed(g, 7, 20, err, sizeof err), 0);
    s_holdout_flags(g, b);
    assert_memory_equal(a, b, g->n_senses * sizeof *a);
    /* 45 of the 60 words have two or more senses. */
    assert_int_equal(data_gcide_holdout_seed(g, 7, 45, err, sizeof err), 0);
    assert_int_equal(data_gcide_holdout_seed(g, 7, 46, err, sizeof err), -1);
    assert_non_null(strstr(err, "only 45 headwords"));
    data_gcide_destroy(&g);
}

static void s_write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Loads a hold-out file made of text; returns its result with the error in err. */
static int s_holdout_text(data_gcide_t *g, const char *path, const char *text, char *err, size_t errlen)
{
    s_write_text(path, text);
    return data_gcide_holdout_file(g, path, err, errlen);
}

static void test_holdout_file(void **state)
{
    (void)state;
    data_gcide_t *g = s_make_many();
    char path[] = "/tmp/test_gcide_holdout_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char err[512];
    bool a[256], b[256];
    assert_int_equal(data_gcide_holdout_seed(g, 3, 30, err, sizeof err), 0);
    s_holdout_flags(g, a);
    assert_int_equal(data_gcide_holdout_write(g, path), 0);
    assert_int_equal(data_gcide_holdout_seed(g, 4, 10, err, sizeof err), 0);
    assert_int_equal(data_gcide_holdout_file(g, path, err, sizeof err), 0);
    assert_int_equal(g->n_held_out, 30);
    s_holdout_flags(g, b);
    assert_memory_equal(a, b, g->n_senses * sizeof *a);

    assert_int_equal(s_holdout_text(g, path, "# comment\n\nab\t2\nad\t4\r\n", err, sizeof err), 0);
    assert_int_equal(g->n_held_out, 2);
    assert_true(g->senses[g->word_first_sense[1] + 1].held_out);
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"ab\t2\nzz\t1\n", ":2: unknown headword \"zz\""},
        {"ab\t3\n", ":1: \"ab\" has 2 senses, not 3"},
        {"ab\t0\n", ":1: bad sense number"},
        {"ab\tx\n", ":1: bad sense number"},
        {"ab 1\n", ":1: expected \"headword<TAB>sense number\""},
        {"ad\t1\nad\t1\n", ":2: \"ad\" sense 1 is listed twice"},
        {"ab\t1\nab\t2\n", "every sense of \"ab\" is held out"},
        {"aa\t1\n", "every sense of \"aa\" is held out"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(s_holdout_text(g, path, bad[i].text, err, sizeof err), -1);
        if (!strstr(err, bad[i].why))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err, bad[i].why);
        assert_non_null(strstr(err, path));
        assert_int_equal(g->n_held_out, 0); /* nothing held out after an error */
    }
    unlink(path);
    assert_int_equal(data_gcide_holdout_file(g, path, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    data_gcide_destroy(&g);
}

/* ---- ranking metrics ---- */

static void test_rank_of_truth(void **state)
{
    (void)state;
    const float s[] = {0.5f, 0.9f, 0.5f, 0.1f, 0.5f};
    assert_int_equal(rank_of_truth(s, 5, 1), 1);
    assert_int_equal(rank_of_truth(s, 5, 0), 3); /* 0.9 above, two others tied: 1 + 1 + 2/2 */
    assert_int_equal(rank_of_truth(s, 5, 3), 5);
    const float flat[] = {0, 0, 0, 0, 0, 0};
    assert_int_equal(rank_of_truth(flat, 6, 2), 1 + 5 / 2); /* ties halved, rounded down */
    const float two[] = {1, 1};
    assert_int_equal(rank_of_truth(two, 2, 1), 1);
    const float nan[] = {NAN, 1, -1};
    assert_int_equal(rank_of_truth(nan, 3, 0), 3);
    assert_int_equal(rank_of_truth(nan, 3, 2), 2);
    assert_int_equal(rank_of_truth(s, 1, 0), 1);
}

static void test_rank_metrics(void **state)
{
    (void)state;
    const uint32_t ranks[] = {101, 1, 10, 2, 100, 11};
    rank_metrics_t m;
    rank_metrics(ranks, 6, &m);
    assert_int_equal(m.n, 6);
    assert_float_equal(m.r1, 1.0 / 6, 1e-12);
    assert_float_equal(m.r10, 3.0 / 6, 1e-12);
    assert_float_equal(m.r100, 5.0 / 6, 1e-12);
    assert_float_equal(m.median_rank, 10.5, 1e-12);
    assert_float_equal(m.mrr, (1 + 0.5 + 0.1 + 1.0 / 11 + 0.01 + 1.0 / 101) / 6, 1e-12);
    rank_metrics(ranks, 5, &m);
    assert_float_equal(m.median_rank, 10, 1e-12);
    rank_metrics(ranks, 0, &m);
    assert_int_equal(m.n, 0);
    assert_float_equal(m.mrr, 0, 0);

    const uint32_t one[] = {4};
    rank_metrics(one, 1, &m);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    rank_metrics_print(f, "tfidf_", &m);
    rank_metrics_print(f, NULL, &m);
    fclose(f);
    assert_string_equal(buf, "tfidf_r1=0.0000 tfidf_r10=1.0000 tfidf_r100=1.0000 tfidf_median_rank=4.0 "
                             "tfidf_mrr=0.2500 tfidf_n=1\n"
                             "r1=0.0000 r10=1.0000 r100=1.0000 median_rank=4.0 mrr=0.2500 n=1\n");
    free(buf);
}

/* ---- TF-IDF ---- */

/* A tiny dictionary for the lexical scores; sense 1 ("a purring feline") is held out. */
static const char *const s_pets[] = {
    "cat:small feline pet", "cat:a purring feline", "dog:loyal canine pet", "dog:canine that barks the",
    "fish:aquatic animal the",
};

static void test_tfidf(void **state)
{
    (void)state;
    data_gcide_t *g = s_make(s_pets, 5);
    g->senses[1].held_out = true; /* cat: "a purring feline" */
    g->n_held_out = 1;
    tfidf_t *t = NULL;
    assert_int_equal(tfidf_build(g, &t), 0);
    /* The held-out sense's words "a" and "purring" are in no document. */
    assert_int_equal(tfidf_n_terms(t), 10);
    float scores[3];
    tfidf_scores(t, g, 1, scores);
    /* Only "feline" matches: cat's document is small, feline, pet with idf ln 3, ln 3, ln 1.5. */
    double l3 = log(3.0), l15 = log(1.5);
    assert_float_equal(scores[0], l3 / sqrt(2 * l3 * l3 + l15 * l15), 1e-5);
    assert_float_equal(scores[1], 0, 0);
    assert_float_equal(scores[2], 0, 0);
    assert_int_equal(rank_of_truth(scores, 3, 0), 1);
    /* A training sense scores against its own document too; "canine" twice weighs 1 + ln 2. */
    tfidf_scores(t, g, 2, scores);
    assert_true(scores[1] > scores[0] && scores[0] > 0 && scores[2] == 0);
    assert_true(scores[1] <= 1.0f + 1e-6f);
    /* "the" is in two of three documents; a query of words every document holds would score 0. */
    data_gcide_destroy(&g);
    tfidf_destroy(&t);
    assert_null(t);
    tfidf_destroy(&t);

    static const char *const flat[] = {"aa:the x", "bb:the y", "cc:the z", "cc:the"};
    g = s_make(flat, 4);
    g->senses[3].held_out = true;
    tfidf_build(g, &t);
    tfidf_scores(t, g, 3, scores);
    for (int i = 0; i < 3; i++)
        assert_float_equal(scores[i], 0, 0); /* idf of "the" is ln(3/3) = 0 */
    assert_int_equal(rank_of_truth(scores, 3, 2), 2);
    tfidf_destroy(&t);
    data_gcide_destroy(&g);
}

/* BM25 on the same tiny dictionary, against the formula worked out by hand. */
static double s_bm25_term(double df, double tf, double dl, double k1, double b)
{
    const double N = 3, avgdl = 13.0 / 3; /* documents: cat 3 words, dog 7, fish 3 */
    return log(1 + (N - df + 0.5) / (df + 0.5)) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl));
}

static void test_bm25(void **state)
{
    (void)state;
    data_gcide_t *g = s_make(s_pets, 5);
    g->senses[1].held_out = true;
    g->n_held_out = 1;
    const float k1s[] = {1.2f, 0.5f, 2.0f}, bs[] = {0.75f, 0.0f, 1.0f};
    for (int c = 0; c < 3; c++) {
        tfidf_t *t = NULL;
        tfidf_opts_t o = {.scheme = TFIDF_BM25, .k1 = k1s[c], .b = bs[c]};
        assert_int_equal(tfidf_build_ex(g, &o, &t), 0);
        float scores[3];
        /* "canine that barks the": dog holds canine (twice), that, barks, the; fish holds the (df 2). */
        tfidf_scores(t, g, 3, scores);
        double k1 = k1s[c], b = bs[c];
        double dog = s_bm25_term(1, 2, 7, k1, b) + 2 * s_bm25_term(1, 1, 7, k1, b) + s_bm25_term(2, 1, 7, k1, b);
        double fish = s_bm25_term(2, 1, 3, k1, b);
        assert_float_equal(scores[1], 1.0, 1e-6); /* the best document scores 1 */
        assert_float_equal(scores[2], fish / dog, 1e-5);
        assert_float_equal(scores[0], 0, 0);
        /* The held-out "a purring feline": only feline (df 1, cat's document) matches. */
        tfidf_scores(t, g, 1, scores);
        assert_float_equal(scores[0], 1.0, 1e-6);
        assert_float_equal(scores[1], 0, 0);
        tfidf_destroy(&t);
    }
    /* Length normalisation: with b = 1 the short fish document gains on the long dog one against b = 0. */
    float s0[3], s1[3];
    tfidf_t *t0 = NULL, *t1 = NULL;
    tfidf_opts_t o0 = {.scheme = TFIDF_BM25, .k1 = 1.2f, .b = 0}, o1 = {.scheme = TFIDF_BM25, .k1 = 1.2f, .b = 1};
    tfidf_build_ex(g, &o0, &t0);
    tfidf_build_ex(g, &o1, &t1);
    tfidf_scores(t0, g, 3, s0);
    tfidf_scores(t1, g, 3, s1);
    assert_true(s1[2] > s0[2]);
    tfidf_destroy(&t0);
    tfidf_destroy(&t1);
    data_gcide_destroy(&g);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_parse_numbered_with_quotations),
    cmocka_unit_test(test_parse_sub_senses_and_sub_entries),
    cmocka_unit_test(test_parse_pjc_and_inline_quotation),
    cmocka_unit_test(test_parse_unnumbered),
    cmocka_unit_test(test_mask),
    cmocka_unit_test(test_b64),
    cmocka_unit_test(test_load_small),
    cmocka_unit_test(test_holdout_seed),
    cmocka_unit_test(test_holdout_file),
    cmocka_unit_test(test_rank_of_truth),
    cmocka_unit_test(test_rank_metrics),
    cmocka_unit_test(test_tfidf),
    cmocka_unit_test(test_bm25))
