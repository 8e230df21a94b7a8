/* A minimal FAISS C API over the FAISS C++ library.
 *
 * Why this file exists: Debian's libfaiss-dev ships the C API headers (/usr/include/faiss/c_api) but only the
 * C++ library (libfaiss.a), not libfaiss_c. knn.cmake links a real libfaiss_c when one is installed and
 * compiles this file only when none is found.
 *
 * Contract: every function here has exactly the signature declared in the C API headers (they are included,
 * so the compiler checks it) and behaves as the upstream C API does: functions returning int return 0 on
 * success and, when the C++ call throws, a FaissErrorCode (-2 FAISS exception, -4 other std::exception,
 * -1 anything else) after remembering the exception's text for faiss_get_last_error() in the calling thread.
 * Only the functions kb_knn.c calls are implemented; add one here (with its real semantics) before using it.
 * Nothing is written to stderr: the caller decides whether and how to log the error. */
#include <faiss/AutoTune.h>
#include <faiss/Index.h>
#include <faiss/IndexIDMap.h>
#include <faiss/IndexIVF.h>
#include <faiss/impl/FaissException.h>
#include <faiss/impl/IDSelector.h>
#include <faiss/index_factory.h>
#include <faiss/utils/distances.h>

#include <exception>
#include <string>

extern "C" {
#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/IndexIVF_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/MetaIndexes_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/impl/AuxIndexStructures_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <faiss/c_api/utils/distances_c.h>
}

namespace {

/* Last error text of this thread; has_error distinguishes "no error yet" (NULL) from an empty message. */
thread_local std::string s_last_error;
thread_local bool s_has_error = false;

void s_set_error(const char *what) {
    s_last_error = what ? what : "unknown error";
    s_has_error = true;
}

/* Runs fn, converting exceptions to the C API's error codes. */
template <typename F>
int s_guard(F &&fn) {
    try {
        fn();
        return 0;
    } catch (const faiss::FaissException &e) {
        s_set_error(e.what());
        return FAISS_EXCEPT;
    } catch (const std::exception &e) {
        s_set_error(e.what());
        return STD_EXCEPT;
    } catch (...) {
        s_set_error("Unknown error");
        return UNKNOWN_EXCEPT;
    }
}

faiss::Index *s_index(FaissIndex *p) {
    return reinterpret_cast<faiss::Index *>(p);
}
const faiss::Index *s_index(const FaissIndex *p) {
    return reinterpret_cast<const faiss::Index *>(p);
}

} // namespace

extern "C" {

/* Text of the last failed call in this thread, or NULL when none failed. Valid until the next failure. */
const char *faiss_get_last_error() {
    return s_has_error ? s_last_error.c_str() : nullptr;
}

/* ---- Index ---- */

void faiss_Index_free(FaissIndex *obj) {
    delete s_index(obj);
}

int faiss_Index_d(const FaissIndex *obj) {
    return s_index(obj)->d;
}

int faiss_Index_is_trained(const FaissIndex *obj) {
    return s_index(obj)->is_trained ? 1 : 0;
}

idx_t faiss_Index_ntotal(const FaissIndex *obj) {
    return s_index(obj)->ntotal;
}

FaissMetricType faiss_Index_metric_type(const FaissIndex *obj) {
    return static_cast<FaissMetricType>(s_index(obj)->metric_type);
}

int faiss_Index_train(FaissIndex *index, idx_t n, const float *x) {
    return s_guard([&] { s_index(index)->train(n, x); });
}

int faiss_Index_add_with_ids(FaissIndex *index, idx_t n, const float *x, const idx_t *xids) {
    return s_guard([&] { s_index(index)->add_with_ids(n, x, xids); });
}

int faiss_Index_search(const FaissIndex *index, idx_t n, const float *x, idx_t k, float *distances,
                       idx_t *labels) {
    return s_guard([&] { s_index(index)->search(n, x, k, distances, labels); });
}

int faiss_Index_remove_ids(FaissIndex *index, const FaissIDSelector *sel, size_t *n_removed) {
    return s_guard([&] {
        size_t n = s_index(index)->remove_ids(*reinterpret_cast<const faiss::IDSelector *>(sel));
        if (n_removed) {
            *n_removed = n;
        }
    });
}

/* ---- distances ---- */

int faiss_get_distance_compute_blas_threshold() {
    return faiss::distance_compute_blas_threshold;
}

/* ---- index_factory ---- */

int faiss_index_factory(FaissIndex **p_index, int d, const char *description, FaissMetricType metric) {
    return s_guard([&] {
        faiss::Index *index = faiss::index_factory(d, description, static_cast<faiss::MetricType>(metric));
        *p_index = reinterpret_cast<FaissIndex *>(index);
    });
}

/* ---- IndexIDMap ---- */

int faiss_IndexIDMap_new(FaissIndexIDMap **p_index, FaissIndex *index) {
    return s_guard([&] {
        faiss::IndexIDMap *idmap = new faiss::IndexIDMap(s_index(index));
        *p_index = reinterpret_cast<FaissIndexIDMap *>(idmap);
    });
}

int faiss_IndexIDMap_own_fields(const FaissIndexIDMap *obj) {
    return reinterpret_cast<const faiss::IndexIDMap *>(obj)->own_fields ? 1 : 0;
}

void faiss_IndexIDMap_set_own_fields(FaissIndexIDMap *obj, int own_fields) {
    reinterpret_cast<faiss::IndexIDMap *>(obj)->own_fields = own_fields != 0;
}

FaissIndexIDMap *faiss_IndexIDMap_cast(FaissIndex *index) {
    return reinterpret_cast<FaissIndexIDMap *>(dynamic_cast<faiss::IndexIDMap *>(s_index(index)));
}

/* ---- IndexIVF ---- */

FaissIndexIVF *faiss_IndexIVF_cast(FaissIndex *index) {
    return reinterpret_cast<FaissIndexIVF *>(dynamic_cast<faiss::IndexIVF *>(s_index(index)));
}

size_t faiss_IndexIVF_nlist(const FaissIndexIVF *obj) {
    return reinterpret_cast<const faiss::IndexIVF *>(obj)->nlist;
}

/* ---- IDSelector ---- */

void faiss_IDSelector_free(FaissIDSelector *obj) {
    delete reinterpret_cast<faiss::IDSelector *>(obj);
}

int faiss_IDSelectorBatch_new(FaissIDSelectorBatch **p_sel, size_t n, const idx_t *indices) {
    return s_guard([&] {
        faiss::IDSelectorBatch *sel = new faiss::IDSelectorBatch(n, indices);
        *p_sel = reinterpret_cast<FaissIDSelectorBatch *>(sel);
    });
}

/* ---- ParameterSpace ---- */

int faiss_ParameterSpace_new(FaissParameterSpace **space) {
    return s_guard([&] { *space = reinterpret_cast<FaissParameterSpace *>(new faiss::ParameterSpace()); });
}

void faiss_ParameterSpace_free(FaissParameterSpace *obj) {
    delete reinterpret_cast<faiss::ParameterSpace *>(obj);
}

int faiss_ParameterSpace_set_index_parameter(const FaissParameterSpace *space, FaissIndex *index,
                                             const char *name, double value) {
    return s_guard([&] {
        reinterpret_cast<const faiss::ParameterSpace *>(space)->set_index_parameter(s_index(index), name, value);
    });
}

} // extern "C"
