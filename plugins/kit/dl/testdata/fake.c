/* A stand-in vendor library for the dl tests: two core functions, one
 * newer function, and a version function. Written for this project. */
int fake_core_a(void) { return 1; }
int fake_core_b(int x) { return x + 1; }
#ifdef WITH_NEWER
int fake_newer(void) { return 2; }
#endif
int fake_version(void) { return FAKE_VERSION; }
