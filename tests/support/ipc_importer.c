/* ipc_importer - the importing process of the IPC tests (ipc_helpers.h):
 *   ipc_importer SOCKET_FD DEVICE_SPEC MODE
 * receives a handle on the inherited socket, imports it on DEVICE_SPEC and
 * plays ipc_child's part (MODE an ipc_child_mode_t); the exit status says
 * which step failed (0: none). */
#include <stdlib.h>

#include "ipc_child.h"

int main(int argc, char **argv) {
  if (argc != 4)
    return 2;
  return ipc_child(atoi(argv[1]), argv[2], (ipc_child_mode_t)atoi(argv[3]));
}
