/* safetensors.h — read (mmap) and write Hugging Face safetensors files.
 *
 * A set is one model.safetensors, or the shards named by model.safetensors.index.json. Opening
 * validates every header: 8-byte length within the file, JSON header, each tensor's dtype and
 * shape (element counts overflow-checked), whole offsets inside the data buffer, size == numel ×
 * dtype size, and the tensors tiling the buffer (no overlap, no hole). Errors name the file
 * and the problem (GE_FORMAT / GE_IO). Tensors stay mmapped until st_close. */
#ifndef GRPOD_SAFETENSORS_H
#define GRPOD_SAFETENSORS_H
#include <stddef.h>

typedef enum { ST_F32, ST_F16, ST_BF16, ST_OTHER } st_dtype;

typedef struct {
    char *name;
    st_dtype dtype;
    char dtype_name[8]; /* as written: "BF16", "I64", ... */
    int ndim;
    long long shape[8];
    long long numel;
    size_t off, end; /* [off, end) in the file's data buffer */
    const void *data; /* into the mapping */
    const char *file; /* path of the file holding it */
} st_tensor;

typedef struct {
    int n;
    st_tensor *t;
    int nfiles;
    char **paths;
    void **maps;
    size_t *sizes;
} st_set;

/* Open DIR/model.safetensors, or DIR/model.safetensors.index.json and its shards. */
int st_open_dir(const char *dir, st_set *s);
/* Add one file to a set (s zeroed before the first call). */
int st_open_file(st_set *s, const char *path);
void st_close(st_set *s);
const st_tensor *st_find(const st_set *s, const char *name);
/* GE_FORMAT naming the tensor unless its shape is exactly dims[0..ndim). */
int st_check_shape(const st_tensor *t, int ndim, const long long *dims);
/* Convert a tensor to fp32, checking its shape is exactly dims[0..ndim). */
int st_read_f32(const st_tensor *t, float *dst, int ndim, const long long *dims);

/* Writer: tensors in the given order, as fp32 or bf16 (from fp32 data, round to nearest even). */
typedef struct {
    const char *name;
    const float *data;
    int ndim;
    long long shape[4];
} st_out;
int st_write(const char *path, const st_out *t, int n, st_dtype dtype);

float f16_to_f32(unsigned short h);
#endif
