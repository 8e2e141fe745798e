/* sigcheck.c - a compile-time check, nothing at run time: the hooks of
 * hooks.h, spelled with plain C types so that the shim builds without the
 * toolkit, must be the very functions cuda.h and cuda_runtime_api.h
 * declare. Compiled only where the toolkit is found; a drifted signature
 * is a "conflicting types" error here. */
#include <cuda.h>
#include <cuda_runtime_api.h>

/* cuda.h maps the name to the CUDA 12 form; the original is declared only
 * for the driver's own build. */
#undef cuGetProcAddress
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn,
                                  int cudaVersion, cuuint64_t flags);
/* The same for CUDA 10.0's cuStreamBeginCapture, before its mode
 * (cudaTypedefs.h: PFN_cuStreamBeginCapture_v10000). */
#undef cuStreamBeginCapture
CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream);
/* And for the original cuDevicePrimaryCtxReset, before CUDA 11.0's _v2
 * (cudaTypedefs.h: PFN_cuDevicePrimaryCtxReset_v7000). */
#undef cuDevicePrimaryCtxReset
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);

/* And for cuGraphInstantiate before CUDA 12.0, with an error node and a
 * log (cudaTypedefs.h: PFN_cuGraphInstantiate_v10000, _v11000); since 12.0
 * the name is cuGraphInstantiateWithFlags. */
#undef cuGraphInstantiate
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                    CUgraphNode *phErrorNode, char *logBuffer,
                                    size_t bufferSize);
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                       CUgraphNode *phErrorNode,
                                       char *logBuffer, size_t bufferSize);

/* And for cuGraphExecUpdate before CUDA 12.0, with an error node and a
 * result (cudaTypedefs.h: PFN_cuGraphExecUpdate_v10020); since 12.0 the
 * name is cuGraphExecUpdate_v2, with a result info. */
#undef cuGraphExecUpdate
CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph,
                                   CUgraphNode *hErrorNode_out,
                                   CUgraphExecUpdateResult *updateResult_out);

/* And for cuGraphAddNode before CUDA 12.3, without edge data
 * (cudaTypedefs.h: PFN_cuGraphAddNode_v12020); since 12.3 the name is
 * cuGraphAddNode_v2. */
#undef cuGraphAddNode
CUresult CUDAAPI cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies,
                                size_t numDependencies,
                                CUgraphNodeParams *nodeParams);

#include <stddef.h>

#include "hooks.h"

_Static_assert(sizeof(CUresult) == sizeof(mp__curesult), "CUresult");
_Static_assert(CU_GRAPH_NODE_TYPE_GRAPH == MP__GRAPH_NODE_TYPE_GRAPH &&
                   sizeof(CUgraphNodeType) == sizeof(unsigned) &&
                   offsetof(CUgraphNodeParams, type) == 0 &&
                   offsetof(CUgraphNodeParams, graph.graph) ==
                       MP__NODE_PARAMS_GRAPH &&
                   offsetof(CUgraphNodeParams, graph.ownership) ==
                       MP__NODE_PARAMS_OWNERSHIP &&
                   sizeof(CUgraphChildGraphNodeOwnership) == sizeof(unsigned) &&
                   CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE ==
                       MP__CHILD_GRAPH_OWNERSHIP_MOVE,
               "child graph node parameters");
#if CUDA_VERSION >= 12030 /* conditional nodes in cuGraphAddNode */
_Static_assert(CU_GRAPH_NODE_TYPE_CONDITIONAL == MP__GRAPH_NODE_TYPE_COND &&
                   offsetof(CUgraphNodeParams, conditional.size) ==
                       MP__NODE_PARAMS_COND_SIZE &&
                   sizeof(((CUgraphNodeParams *)0)->conditional.size) ==
                       sizeof(unsigned) &&
                   offsetof(CUgraphNodeParams, conditional.phGraph_out) ==
                       MP__NODE_PARAMS_COND_BODIES,
               "conditional node parameters");
#endif
_Static_assert(sizeof(cudaError_t) == sizeof(mp__cudaerr), "cudaError_t");
_Static_assert(sizeof(CUdeviceptr) == sizeof(mp__cuptr), "CUdeviceptr");
_Static_assert(CUDA_ERROR_OUT_OF_MEMORY == MP__CU_OUT_OF_MEMORY, "errors");
_Static_assert(cudaErrorMemoryAllocation == MP__CUDA_MEMORY_ALLOCATION,
               "errors");
_Static_assert(CUDA_ERROR_NOT_SUPPORTED == MP__CU_NOT_SUPPORTED, "errors");
_Static_assert(CUDA_ERROR_NOT_FOUND == MP__CU_NOT_FOUND, "errors");
_Static_assert(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ==
                       MP__CU_POINTER_RANGE_START &&
                   CU_POINTER_ATTRIBUTE_RANGE_SIZE == MP__CU_POINTER_RANGE_SIZE,
               "pointer attributes");
_Static_assert(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE ==
                   MP__CU_POINTER_LEGACY_IPC,
               "pointer attributes");
_Static_assert(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ==
                   MP__CU_PROC_PER_THREAD,
               "flags");
