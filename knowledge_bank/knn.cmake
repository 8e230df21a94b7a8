# Nearest-neighbour support for carls_kb (kb_knn.c speaks the FAISS C API).
#
# A real FAISS C API library (libfaiss_c) is used when one is installed. Debian ships the C API headers but
# only the C++ library (libfaiss.a), so otherwise we compile our own C API shim (faiss_c/faiss_c_shim.cpp)
# over libfaiss.a. A static libfaiss.a brings its dependencies along by hand:
#   - OpenMP's runtime (GOMP_parallel, omp_set_num_threads, ...): OpenMP::OpenMP_CXX. kb_knn.c calls
#     omp_set_num_threads too but needs only omp.h (in GCC's own include dir) and this runtime, so no
#     -fopenmp lands on the other carls_kb C files;
#   - BLAS (sgemm_, ssyrk_, dgemm_) and LAPACK (sgesvd_, ssyev_, sgeqrf_, sorgqr_, sgetrf_, ...): Debian's
#     OpenBLAS carries both, and we link it directly rather than through libblas.so/liblapack.so so that
#     openblas_set_num_threads() in kb_knn.c talks to the very library FAISS calls;
#   - the C++ runtime: carls_kb holds a C++ source, so CMake links its users with the C++ driver.
find_path(FAISS_C_INCLUDE_DIR faiss/c_api/faiss_c.h)
if(NOT FAISS_C_INCLUDE_DIR)
  message(FATAL_ERROR "FAISS C API headers not found (install libfaiss-dev)")
endif()
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_library(FAISS_C_LIBRARY NAMES faiss_c)

if(FAISS_C_LIBRARY)
  message(STATUS "carls-c: FAISS C API library ${FAISS_C_LIBRARY}")
  target_link_libraries(carls_kb PUBLIC ${FAISS_C_LIBRARY})
else()
  find_library(FAISS_LIBRARY NAMES faiss)
  if(NOT FAISS_LIBRARY)
    message(FATAL_ERROR "neither libfaiss_c nor libfaiss found (install libfaiss-dev)")
  endif()
  message(STATUS "carls-c: no libfaiss_c; building our C API shim over ${FAISS_LIBRARY}")
  target_sources(carls_kb PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/faiss_c/faiss_c_shim.cpp)
  target_link_libraries(carls_kb PUBLIC ${FAISS_LIBRARY})
endif()
# PRIVATE: a static library's private dependencies still reach its users' link lines (as LINK_ONLY).
target_link_libraries(carls_kb PRIVATE OpenMP::OpenMP_CXX PkgConfig::OPENBLAS Threads::Threads)
