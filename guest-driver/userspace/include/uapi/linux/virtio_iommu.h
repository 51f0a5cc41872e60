/* the wire format from the system's uapi header, over the shim's types */
#include "../../ut_shim.h"
#include <linux/virtio_iommu.h>
