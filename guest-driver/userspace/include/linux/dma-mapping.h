#include "../ut_shim.h"
