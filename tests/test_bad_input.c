#include <criterion/criterion.h>
Test(placeholder, todo) { cr_assert(1); }
