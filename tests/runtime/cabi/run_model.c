/* A C program linked against a library `celosia export` wrote (the header is passed as
 * -include NAME.h): reads input i from DIR/in<i>.bin, runs, writes output i to
 * DIR/out<i>.bin. MODE "run" runs as declared; "wrong_shape" passes input 0 with its first
 * dimension one larger; "wrong_count" passes one input too few. Exit status: celosia_run's
 * result (0 on success), its message on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t nbytes(int ndim, const int64_t *shape, DLDataType t) {
  size_t n = t.bits / 8;
  for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
  return n;
}

int main(int argc, char **argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s DIR MODE\n", argv[0]); return 2; }
  const char *dir = argv[1], *mode = argv[2];
  int ni = celosia_num_inputs(), no = celosia_num_outputs();
  DLTensor *in = calloc(ni, sizeof *in), *out = calloc(no, sizeof *out);
  int64_t wrong[16];
  char path[4096];
  for (int i = 0; i < ni; i++) {
    int nd = celosia_input_ndim(i);
    const int64_t *shape = celosia_input_shape(i);
    DLDataType t = celosia_input_dtype(i);
    size_t n = nbytes(nd, shape, t);
    void *data = malloc(n ? n : 1);
    snprintf(path, sizeof path, "%s/in%d.bin", dir, i);
    FILE *f = fopen(path, "rb");
    if (!f || fread(data, 1, n, f) != n) { fprintf(stderr, "cannot read %s\n", path); return 2; }
    fclose(f);
    in[i].data = data;
    in[i].device.device_type = kDLCPU;
    in[i].ndim = nd;
    in[i].dtype = t;
    in[i].shape = (int64_t *)shape;
    in[i].strides = NULL;
    if (i == 0 && strcmp(mode, "wrong_shape") == 0) {
      memcpy(wrong, shape, nd * sizeof *shape);
      wrong[0] += 1;
      in[i].shape = wrong;
    }
  }
  for (int i = 0; i < no; i++) {
    int nd = celosia_output_ndim(i);
    const int64_t *shape = celosia_output_shape(i);
    DLDataType t = celosia_output_dtype(i);
    out[i].data = malloc(nbytes(nd, shape, t) + 1);
    out[i].device.device_type = kDLCPU;
    out[i].ndim = nd;
    out[i].dtype = t;
    out[i].shape = (int64_t *)shape;
  }
  int rc = celosia_run(in, strcmp(mode, "wrong_count") == 0 ? ni - 1 : ni, out, no);
  if (rc != 0) { fprintf(stderr, "%s\n", celosia_last_error()); return rc < 0 ? -rc : rc; }
  for (int i = 0; i < no; i++) {
    snprintf(path, sizeof path, "%s/out%d.bin", dir, i);
    FILE *f = fopen(path, "wb");
    fwrite(out[i].data, 1, nbytes(out[i].ndim, out[i].shape, out[i].dtype), f);
    fclose(f);
  }
  printf("%s: %d inputs, %d outputs, ok\n", celosia_model_name(), ni, no);
  return 0;
}
