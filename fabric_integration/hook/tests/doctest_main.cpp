// doctest's main() for the hook suite (the shared one in tests/ is defined after this folder).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
