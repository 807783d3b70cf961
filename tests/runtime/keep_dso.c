/* Preloaded into the ranks of suite runtime_asan (tests/runtime/meson.build): dlclose() does
 * nothing, so the Open MPI components a rank loaded with dlopen stay mapped until exit and
 * LeakSanitizer can name them in its stacks; their leaks are then matched by module name in
 * lsan_openmpi.supp. Without it their frames are "<unknown module>" and cannot be told from
 * the program's own. Test-only: never installed. */
int dlclose(void *handle);

int dlclose(void *handle)
{
	(void)handle;
	return 0;
}
