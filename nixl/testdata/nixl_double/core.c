// Test double of libnixl.so: the C API double below calls into it and is
// linked without a run path, as the real libnixl_capi.so is, so it loads
// only if this library was loaded first with RTLD_GLOBAL.
int nixl_double_core_version(void) { return 1; }
