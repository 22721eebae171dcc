import os
import sys

# Children of the control plane always exec at once; gRPC's fork handlers are not needed there.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from controlplane.cli import main

sys.exit(main())
