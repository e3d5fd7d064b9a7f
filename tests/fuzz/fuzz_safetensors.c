/* libFuzzer target for the safetensors loader (st_load, st_load_tensor, st_check_finite): any
 * input must give either a validated file whose every tensor reads in bounds, or a one-line
 * error; never a crash, a sanitizer report, an exit or a hang. */
#include <stdint.h>
#include <string.h>

#include "core/common.h"
#include "fuzz_common.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    StFile f;
    SeqErr e;
    if (st_load(fuzz_memfile(data, size), &f, &e) != 0) {
        if (strchr(e.msg, '\n') || !e.msg[0]) abort(); /* errors are one non-empty line */
        return 0;
    }
    for (int i = 0; i < f.n_tensors; i++) {
        const StTensor *t = &f.tensors[i];
        size_t numel = (t->end - t->begin) / (t->dtype == ST_F32 ? 4 : 2);
        float *dst = xmalloc((numel ? numel : 1) * sizeof(float));
        if (st_load_tensor(&f, t->name, t->ndim, t->shape, dst, &e) == 0)
            (void)st_check_finite(dst, numel, t->name, f.path, &e);
        xfree(dst);
    }
    st_close(&f);
    return 0;
}
