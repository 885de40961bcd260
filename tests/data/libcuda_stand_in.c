/* A stand-in for libcuda with the real entry points' C signatures, for tests/test_driver.py:
   DriverRuntime's ctypes calls cross a real C ABI (64-bit stream handles and device pointers,
   out-parameters) without a GPU. Two devices; device d's primary context is 0x1000 + d. */
#include <stdint.h>
#include <stdio.h>

typedef int CUresult;
enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, INVALID_CONTEXT = 201 };

static int initialized;
static void *current;
static uint64_t next_pointer = 0x7f0000000000ULL, last_freed;
static void *last_stream;

CUresult cuInit(unsigned flags) { initialized = flags == 0; return OK; }
CUresult cuDeviceGetCount(int *count) {
    if (!initialized) return NOT_INITIALIZED;
    *count = 2;
    return OK;
}
CUresult cuDeviceGet(int *device, int ordinal) {
    if (ordinal < 0 || ordinal > 1) return INVALID_VALUE;
    *device = ordinal;
    return OK;
}
CUresult cuDeviceGetAttribute(int *value, int attribute, int device) {
    *value = attribute == 75 ? 9 : attribute == 76 ? 0 : attribute == 16 ? 132 - device : -1;
    return OK;
}
CUresult cuDeviceGetName(char *name, int size, int device) {
    snprintf(name, size, "Stand-in H100 #%d", device);
    return OK;
}
CUresult cuCtxGetDevice(int *device) {
    if (!current) return INVALID_CONTEXT;
    *device = (int)((uintptr_t)current - 0x1000);
    return OK;
}
CUresult cuCtxGetCurrent(void **context) { *context = current; return OK; }
CUresult cuCtxSetCurrent(void *context) { current = context; return OK; }
CUresult cuCtxSynchronize(void) { return current ? OK : INVALID_CONTEXT; }
CUresult cuDevicePrimaryCtxRetain(void **context, int device) {
    *context = (void *)(uintptr_t)(0x1000 + device);
    return OK;
}
/* Capturing: only the stream whose handle needs all 64 bits to tell apart. With no context
   current it fails, as an H100's driver did for a thread that had made no CUDA call. */
CUresult cuStreamIsCapturing(void *stream, int *status) {
    if (!current) return INVALID_CONTEXT;
    *status = (uintptr_t)stream == 0x7fff00000005ULL;
    return OK;
}
CUresult cuMemAllocAsync(uint64_t *pointer, size_t size, void *stream) {
    if (!current) return INVALID_CONTEXT;
    *pointer = next_pointer;
    next_pointer += size;
    last_stream = stream;
    return OK;
}
CUresult cuMemFreeAsync(uint64_t pointer, void *stream) {
    if (!current) return INVALID_CONTEXT;
    last_freed = pointer;
    last_stream = stream;
    return OK;
}
CUresult cuMemFree_v2(uint64_t pointer) {
    if (!current) return INVALID_CONTEXT;
    last_freed = pointer;
    return OK;
}
/* cuda.h's cuMemFree is cuMemFree_v2; the bare symbol is the legacy one (32-bit pointers). */
CUresult cuMemFree(uint32_t pointer) { (void)pointer; return INVALID_CONTEXT; }
CUresult cuGetErrorName(int error, const char **name) {
    if (error != INVALID_VALUE) return INVALID_VALUE;
    *name = "CUDA_ERROR_INVALID_VALUE";
    return OK;
}
/* A launch and a graph replay record what they were handed, every parameter widened to 64 bits. */
static uint64_t last_launch[11];
CUresult cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                        void **extra) {
    if (!current) return INVALID_CONTEXT;  /* as the driver refuses a thread without one */
    uint64_t seen[11] = {(uintptr_t)function, gx, gy, gz, bx, by, bz, shared, (uintptr_t)stream,
                         (uintptr_t)params, (uintptr_t)extra};
    for (int i = 0; i < 11; i++) last_launch[i] = seen[i];
    return OK;
}
CUresult cuGraphLaunch(void *exec, void *stream) {
    last_launch[0] = (uintptr_t)exec;
    last_launch[8] = (uintptr_t)stream;
    return OK;
}
/* What the stand-in saw, for the test to compare. */
const uint64_t *stand_in_last_launch(void) { return last_launch; }
uint64_t stand_in_last_freed(void) { return last_freed; }
void *stand_in_last_stream(void) { return last_stream; }
void *stand_in_current(void) { return current; }
void stand_in_forget_context(void) { current = 0; }  /* as a thread that never set a device */
