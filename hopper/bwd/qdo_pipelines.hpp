// The Q+LSE and dO+dPsum pipelines of the backward, which advance together (one stage of each per step): the dO
// pipeline's parameters and, when the shared memory holds fewer dO stages than Q stages (the swapped dK/dV layouts of
// large head dims), its own state.
#pragma once
#include <cute/util/type_traits.hpp>
#include <cutlass/pipeline/pipeline.hpp>

namespace flash_dash {
namespace bwd {

// The dO pipeline's parameters: the Q pipeline's but for its own transaction bytes (a dO tile, whose head dim may
// differ from Q's, and one fp32 per row), in its own type when the stage counts differ.
template <class PipelinedO, class ParamsQ>
CUTLASS_DEVICE typename PipelinedO::Params dO_pipeline_params(ParamsQ const& pq, uint32_t transaction_bytes) {
    if constexpr (cute::is_same_v<ParamsQ, typename PipelinedO::Params>) {
        ParamsQ p = pq;
        p.transaction_bytes = transaction_bytes;
        return p;
    } else {
        typename PipelinedO::Params p;
        p.transaction_bytes = transaction_bytes;
        p.role = static_cast<typename PipelinedO::ThreadCategory>(static_cast<int>(pq.role));
        p.is_leader = pq.is_leader;
        p.num_consumers = pq.num_consumers;
        p.num_producers = pq.num_producers;
        p.initializing_warp = pq.initializing_warp;
        return p;
    }
}

// The dO pipeline's own state, beside the Q pipeline's, when it has fewer stages (kOwnState); otherwise the roles use
// the Q state for both pipelines, as the kernels did before the counts could differ: every indirection to that one
// state tried (a wrapper struct, accessor functions, a reference) changed the existing kernels' SASS.
template <uint32_t kStagesQ, uint32_t kStagesdO>
struct DoState {
    static constexpr bool kOwnState = kStagesQ != kStagesdO;
    struct None {};
    using type = cute::conditional_t<kOwnState, cutlass::PipelineState<kStagesdO>, None>;
};

}  // namespace bwd
}  // namespace flash_dash
