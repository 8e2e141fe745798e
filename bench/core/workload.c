/* workload.c - event arrays, and the built-in workloads that fill them.
 *
 * Every workload is a deterministic function of its parameters and seed
 * (splitmix64), so two runs, two allocators or two machines replay the same
 * events. Slots: an allocation takes the most recently freed slot (a LIFO
 * free list) or a new one, so nslots is the most allocations ever live at
 * once and a replay's pointer table stays small. Invariant: a slot is live
 * between its MPB_ALLOC and MPB_FREE events and in no free list meanwhile.
 *
 * The generators model what the issue asks for:
 *  - llm: weights loaded once; requests with random batch, prompt and
 *    generation lengths; per-layer temporaries; a KV cache per layer that
 *    grows by concatenation each decode step (allocate the bigger one, free
 *    the old one).
 *  - cnn: weights once; inference batches of changing size; activations
 *    that live until the next layer (and a skip connection) used them; a
 *    per-layer workspace.
 *  - random: RMM's random_allocations pattern: random sizes, random frees,
 *    bounded live bytes.
 *  - adversarial: big blocks interleaved with small long-lived ones, freed,
 *    then asked for again slightly bigger, so no earlier hole fits.
 *  - staging: what a serving engine puts through page-locked host buffers
 *    (run it with the host-* allocators): per step, input ids and positions
 *    staged in, sampled ids and sometimes log-probabilities staged out,
 *    and now and then a run of KV-cache blocks offloaded to host memory
 *    that stays there for some steps before it is swapped back in.
 *  - colocate: two tenants (an RLHF trainer and an inference engine) take
 *    turns on one device through pause and resume, each replacing some of
 *    its blocks in its turn; only pools with virtual memory can replay it
 *    (MPB_PAUSE/MPB_RESUME events). */
#include <stdlib.h>
#include <string.h>

/* internal.h for: mp__fail, mp__kv_each, mp__parse_size, mp__parse_u64 (specs
 * parsed as pool options are), mp__fmt_bytes. */
#include "internal.h"
#include "mpbench.h"

/* ---- event arrays ----------------------------------------------------- */

void mpb_workload_init(mpb_workload_t *w, const char *name) {
  memset(w, 0, sizeof *w);
  snprintf(w->name, sizeof w->name, "%s", name ? name : "");
  w->nstreams = 1;
  w->ntenants = 1;
}

void mpb_workload_free(mpb_workload_t *w) {
  free(w->ev);
  free(w->free_slots);
  free(w->slot_size);
  char name[sizeof w->name];
  memcpy(name, w->name, sizeof name);
  mpb_workload_init(w, name);
}

bool mpb_grow(void *arr, size_t *cap, size_t n, size_t elem) {
  if (n < *cap)
    return true;
  size_t ncap = *cap ? *cap * 2 : 64;
  void *p = realloc(*(void **)arr, ncap * elem);
  if (p == NULL)
    return false;
  *(void **)arr = p;
  *cap = ncap;
  return true;
}

static mp_status_t mpb_push(mpb_workload_t *w, mpb_event_t e) {
  if (w->max_events != 0 && w->n >= w->max_events)
    return mp__fail(MP_EINVAL,
                    "workload %s: its parameters make more than %zu events "
                    "(the most a built-in workload may make): lower them",
                    w->name, w->max_events);
  if (!mpb_grow(&w->ev, &w->cap, w->n, sizeof *w->ev))
    return mp__fail(MP_ENOMEM, "%s: out of host memory for events", w->name);
  e.tenant = w->tenant;
  w->ev[w->n++] = e;
  return MP_OK;
}

mp_status_t mpb_workload_turn(mpb_workload_t *w, uint8_t op, uint8_t tenant) {
  if ((op != MPB_PAUSE && op != MPB_RESUME) || tenant >= MPB_MAX_TENANTS)
    return mp__fail(MP_EINVAL, "%s: bad pause/resume event (op %u, tenant %u)",
                    w->name, op, tenant);
  uint8_t cur = w->tenant;
  w->tenant = tenant;
  mp_status_t st = mpb_push(w, (mpb_event_t){.op = op});
  w->tenant = cur;
  if (st == MP_OK && tenant + 1u > w->ntenants)
    w->ntenants = (uint8_t)(tenant + 1);
  return st;
}

mp_status_t mpb_workload_alloc(mpb_workload_t *w, size_t size, uint16_t stream,
                               uint32_t *slot) {
  /* Every figure (peak live, the ratios, the offline placement) is built
   * on the live bytes: more than a size_t holds would wrap them all. */
  if (size > SIZE_MAX - w->live)
    return mp__fail(MP_EINVAL,
                    "%s: an allocation of %zu bytes makes the live bytes "
                    "exceed the address space (%zu live)",
                    w->name, size, w->live);
  uint32_t s;
  if (w->nfree > 0) {
    s = w->free_slots[--w->nfree];
  } else {
    if (w->nslots == UINT32_MAX)
      return mp__fail(MP_EINVAL, "%s: too many live allocations", w->name);
    s = w->nslots;
    /* slot_size grows with nslots; free_slots can never hold more. */
    if (s >= w->free_cap) {
      size_t cap = w->free_cap ? w->free_cap * 2 : 64;
      size_t *ss = realloc(w->slot_size, cap * sizeof *ss);
      if (ss == NULL)
        return mp__fail(MP_ENOMEM, "%s: out of host memory", w->name);
      w->slot_size = ss;
      uint32_t *fs = realloc(w->free_slots, cap * sizeof *fs);
      if (fs == NULL)
        return mp__fail(MP_ENOMEM, "%s: out of host memory", w->name);
      w->free_slots = fs;
      w->free_cap = cap;
    }
    w->nslots++;
  }
  mp_status_t st = mpb_push(
      w, (mpb_event_t){
             .size = size, .slot = s, .stream = stream, .op = MPB_ALLOC});
  if (st != MP_OK) {
    w->free_slots[w->nfree++] = s;
    return st;
  }
  w->slot_size[s] = size;
  w->live += size;
  if ((uint32_t)stream + 1 > w->nstreams)
    w->nstreams = (uint32_t)stream + 1;
  *slot = s;
  return MP_OK;
}

mp_status_t mpb_workload_free_slot(mpb_workload_t *w, uint32_t slot) {
  mp_status_t st = mpb_push(
      w,
      (mpb_event_t){.size = w->slot_size[slot], .slot = slot, .op = MPB_FREE});
  if (st == MP_OK) {
    w->free_slots[w->nfree++] = slot;
    w->live -= w->slot_size[slot];
  }
  return st;
}

mp_status_t mpb_workload_graph(mpb_workload_t *w, unsigned what,
                               uint16_t stream) {
  mp_status_t st = mpb_push(
      w, (mpb_event_t){.slot = what, .stream = stream, .op = MPB_GRAPH});
  if (st == MP_OK && (uint32_t)stream + 1 > w->nstreams)
    w->nstreams = (uint32_t)stream + 1;
  w->has_graph |= st == MP_OK;
  return st;
}

mp_status_t mpb_workload_drain(mpb_workload_t *w) {
  bool *live = calloc(w->nslots ? w->nslots : 1, sizeof *live);
  if (live == NULL)
    return mp__fail(MP_ENOMEM, "%s: out of host memory", w->name);
  for (size_t i = 0; i < w->n; i++)
    if (w->ev[i].op == MPB_ALLOC || w->ev[i].op == MPB_FREE)
      live[w->ev[i].slot] = w->ev[i].op == MPB_ALLOC;
  mp_status_t st = MP_OK;
  for (uint32_t s = 0; s < w->nslots && st == MP_OK; s++)
    if (live[s])
      st = mpb_workload_free_slot(w, s);
  free(live);
  return st;
}

/* ---- parameters --------------------------------------------------------- */

typedef struct mpb_param {
  const char *key;
  bool is_size; /* takes K/M/G suffixes */
  uint64_t value;
  uint64_t min, max;
  const char *help;
} mpb_param_t;

typedef struct mpb_params {
  const char *workload;
  mpb_param_t *p;
  size_t n;
} mpb_params_t;

static mp_status_t mpb_param_set(void *ctx, const char *key, size_t key_len,
                                 const char *val, size_t val_len) {
  mpb_params_t *ps = ctx;
  for (size_t i = 0; i < ps->n; i++) {
    mpb_param_t *p = &ps->p[i];
    if (strlen(p->key) != key_len || memcmp(p->key, key, key_len) != 0)
      continue;
    uint64_t v;
    size_t sz;
    bool ok = p->is_size ? mp__parse_size(val, val_len, &sz)
                         : mp__parse_u64(val, val_len, &v);
    if (p->is_size)
      v = sz;
    if (!ok || v < p->min || v > p->max)
      return mp__fail(MP_EINVAL,
                      "workload %s: bad value '%.*s' for %s (%s from %llu to "
                      "%llu)",
                      ps->workload, (int)val_len, val, p->key,
                      p->is_size ? "a size" : "an integer",
                      (unsigned long long)p->min, (unsigned long long)p->max);
    p->value = v;
    return MP_OK;
  }
  return mp__fail(MP_EINVAL, "workload %s: unknown parameter '%.*s'",
                  ps->workload, (int)key_len, key);
}

static uint64_t mpb_param(const mpb_params_t *ps, const char *key) {
  for (size_t i = 0; i < ps->n; i++)
    if (strcmp(ps->p[i].key, key) == 0)
      return ps->p[i].value;
  return 0;
}

/* ---- PRNG: splitmix64 -------------------------------------------------- */

static uint64_t mpb_rand(uint64_t *state) {
  uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static uint64_t mpb_rand_range(uint64_t *state, uint64_t lo, uint64_t hi) {
  if (hi <= lo)
    return lo;
  return lo + mpb_rand(state) % (hi - lo + 1);
}

/* ---- llm ------------------------------------------------------------------
 */

#define MPB_TRY(x)                                                             \
  do {                                                                         \
    mp_status_t st_ = (x);                                                     \
    if (st_ != MP_OK)                                                          \
      return st_;                                                              \
  } while (0)

static mpb_param_t mpb_llm_params[] = {
    {"seed", false, 1, 0, UINT64_MAX, "PRNG seed"},
    {"requests", false, 24, 1, 100000, "requests served one after another"},
    {"layers", false, 24, 1, 1000, "transformer layers"},
    {"hidden", false, 2048, 64, 65536, "hidden size (fp16 elements)"},
    {"vocab", false, 32000, 1, 1000000, "vocabulary (logits per token)"},
    {"max_batch", false, 8, 1, 4096, "batch size drawn from 1..max_batch"},
    {"max_prompt", false, 1024, 1, 1000000, "prompt length from 1..max_prompt"},
    {"max_gen", false, 96, 1, 100000, "generated tokens from 1..max_gen"},
};

static mp_status_t mpb_gen_llm(mpb_workload_t *w, const mpb_params_t *ps) {
  uint64_t rng = mpb_param(ps, "seed");
  size_t layers = mpb_param(ps, "layers");
  size_t hidden = mpb_param(ps, "hidden");
  size_t vocab = mpb_param(ps, "vocab");
  const size_t h2 = hidden * 2; /* bytes of one fp16 hidden vector */
  uint32_t slot, tmp[4];
  /* Weights, loaded once: embedding, then per layer attention and MLP. */
  MPB_TRY(mpb_workload_alloc(w, vocab * h2, 0, &slot));
  for (size_t l = 0; l < layers; l++) {
    MPB_TRY(mpb_workload_alloc(w, 4 * hidden * h2, 0, &slot));
    MPB_TRY(mpb_workload_alloc(w, 8 * hidden * h2, 0, &slot));
    MPB_TRY(mpb_workload_alloc(w, 2 * h2, 0, &slot));
  }
  uint32_t *kv = malloc(layers * sizeof *kv);
  if (kv == NULL)
    return mp__fail(MP_ENOMEM, "llm: out of host memory");
  mp_status_t st = MP_OK;
  for (uint64_t r = 0; r < mpb_param(ps, "requests") && st == MP_OK; r++) {
    size_t batch = mpb_rand_range(&rng, 1, mpb_param(ps, "max_batch"));
    size_t prompt = mpb_rand_range(&rng, 1, mpb_param(ps, "max_prompt"));
    size_t gen = mpb_rand_range(&rng, 1, mpb_param(ps, "max_gen"));
    /* Prefill (tokens = prompt), then decode steps of one token, each
     * step growing every layer's KV cache by one position. */
    for (size_t step = 0; step <= gen && st == MP_OK; step++) {
      size_t tokens = step == 0 ? prompt : 1;
      size_t seq = prompt + step; /* positions in the cache after this step */
      size_t act = batch * tokens * h2;
      for (size_t l = 0; l < layers && st == MP_OK; l++) {
        /* Per-layer temporaries: qkv, attention scores, MLP up. */
        if ((st = mpb_workload_alloc(w, 3 * act, 0, &tmp[0])) != MP_OK ||
            (st = mpb_workload_alloc(w, batch * tokens * seq * 2 * 16, 0,
                                     &tmp[1])) != MP_OK ||
            (st = mpb_workload_alloc(w, 4 * act, 0, &tmp[2])) != MP_OK)
          break;
        /* The KV cache: the new, bigger one, then the old one goes. */
        uint32_t old = kv[l];
        if ((st = mpb_workload_alloc(w, 2 * batch * seq * h2, 0, &kv[l])) !=
            MP_OK)
          break;
        if (step > 0 && (st = mpb_workload_free_slot(w, old)) != MP_OK)
          break;
        if ((st = mpb_workload_free_slot(w, tmp[1])) != MP_OK ||
            (st = mpb_workload_free_slot(w, tmp[0])) != MP_OK ||
            (st = mpb_workload_free_slot(w, tmp[2])) != MP_OK)
          break;
      }
      if (st != MP_OK)
        break;
      /* Logits of the last position, fp32, then sampling. */
      if ((st = mpb_workload_alloc(w, batch * vocab * 4, 0, &tmp[3])) == MP_OK)
        st = mpb_workload_free_slot(w, tmp[3]);
    }
    for (size_t l = 0; l < layers && st == MP_OK; l++)
      st = mpb_workload_free_slot(w, kv[l]);
  }
  free(kv);
  return st;
}

/* ---- cnn ---------------------------------------------------------------- */

static mpb_param_t mpb_cnn_params[] = {
    {"seed", false, 1, 0, UINT64_MAX, "PRNG seed"},
    {"batches", false, 200, 1, 1000000, "inference batches"},
    {"max_batch", false, 64, 1, 4096, "batch size drawn from 1..max_batch"},
    {"layers", false, 24, 2, 1000, "convolution layers"},
    {"image", false, 224, 8, 8192, "input height and width"},
    {"channels", false, 64, 1, 4096, "channels of the first layer"},
};

static mp_status_t mpb_gen_cnn(mpb_workload_t *w, const mpb_params_t *ps) {
  uint64_t rng = mpb_param(ps, "seed");
  size_t layers = mpb_param(ps, "layers");
  size_t image = mpb_param(ps, "image");
  size_t ch0 = mpb_param(ps, "channels");
  uint32_t slot;
  /* A ResNet-like shape: every 6 layers the spatial size halves and the
   * channels double. Weights: 3x3 convolutions, fp32. */
  size_t *hw = malloc(layers * sizeof *hw), *ch = malloc(layers * sizeof *ch);
  uint32_t *act = malloc((layers + 1) * sizeof *act);
  mp_status_t st = MP_OK;
  if (hw == NULL || ch == NULL || act == NULL) {
    st = mp__fail(MP_ENOMEM, "cnn: out of host memory");
    goto out;
  }
  for (size_t l = 0; l < layers; l++) {
    size_t stage = l / 6;
    hw[l] = image >> (stage < 5 ? stage + 1 : 5);
    if (hw[l] == 0)
      hw[l] = 1;
    ch[l] = ch0 << (stage < 4 ? stage : 4);
    size_t cin = l ? ch[l - 1] : 3;
    if ((st = mpb_workload_alloc(w, ch[l] * cin * 9 * 4, 0, &slot)) != MP_OK)
      goto out;
  }
  for (uint64_t b = 0; b < mpb_param(ps, "batches") && st == MP_OK; b++) {
    size_t batch = mpb_rand_range(&rng, 1, mpb_param(ps, "max_batch"));
    /* act[0] is the input batch; act[l+1] the output of layer l. */
    if ((st = mpb_workload_alloc(w, batch * 3 * image * image * 4, 0,
                                 &act[0])) != MP_OK)
      break;
    for (size_t l = 0; l < layers && st == MP_OK; l++) {
      uint32_t ws;
      size_t out_b = batch * ch[l] * hw[l] * hw[l] * 4;
      if ((st = mpb_workload_alloc(w, out_b, 0, &act[l + 1])) != MP_OK ||
          (st = mpb_workload_alloc(w, out_b / 4 + 4096, 0, &ws)) != MP_OK ||
          (st = mpb_workload_free_slot(w, ws)) != MP_OK)
        break;
      /* The input of layer l-1 was kept for the skip connection into
       * layer l; both are done now. */
      if (l >= 1)
        st = mpb_workload_free_slot(w, act[l - 1]);
    }
    if (st != MP_OK)
      break;
    if ((st = mpb_workload_free_slot(w, act[layers - 1])) != MP_OK)
      break;
    /* The result: class scores, copied out before the last output goes. */
    uint32_t scores;
    if ((st = mpb_workload_alloc(w, batch * 1000 * 4, 0, &scores)) != MP_OK)
      break;
    if ((st = mpb_workload_free_slot(w, act[layers])) != MP_OK)
      break;
    st = mpb_workload_free_slot(w, scores);
  }
out:
  free(hw);
  free(ch);
  free(act);
  return st;
}

/* ---- random ---------------------------------------------------------------
 */

static mpb_param_t mpb_random_params[] = {
    {"seed", false, 1, 0, UINT64_MAX, "PRNG seed"},
    {"n", false, 50000, 1, 100000000, "allocations"},
    {"max_size", true, (uint64_t)64 << 20, 1, (uint64_t)1 << 40,
     "sizes uniform in 1..max_size"},
    {"max_live", true, (uint64_t)2 << 30, 1, (uint64_t)1 << 44,
     "live bytes never exceed this"},
};

static mp_status_t mpb_gen_random(mpb_workload_t *w, const mpb_params_t *ps) {
  uint64_t rng = mpb_param(ps, "seed");
  uint64_t n = mpb_param(ps, "n");
  size_t max_size = mpb_param(ps, "max_size");
  size_t max_live = mpb_param(ps, "max_live");
  if (max_size > max_live)
    return mp__fail(MP_EINVAL,
                    "workload random: max_size (%zu) is above "
                    "max_live (%zu)",
                    max_size, max_live);
  /* live[] holds the slots allocated and not yet freed, in any order. */
  uint32_t *live = malloc((size_t)n * sizeof *live);
  if (live == NULL)
    return mp__fail(MP_ENOMEM, "random: out of host memory");
  size_t nlive = 0, live_bytes = 0;
  mp_status_t st = MP_OK;
  for (uint64_t done = 0; done < n && st == MP_OK;) {
    size_t size = mpb_rand_range(&rng, 1, max_size);
    bool do_alloc = nlive == 0 || (mpb_rand(&rng) & 1);
    if (do_alloc && live_bytes + size <= max_live) {
      st = mpb_workload_alloc(w, size, 0, &live[nlive]);
      if (st == MP_OK) {
        live_bytes += size;
        nlive++;
        done++;
      }
    } else if (nlive > 0) {
      size_t i = mpb_rand(&rng) % nlive;
      live_bytes -= w->slot_size[live[i]];
      st = mpb_workload_free_slot(w, live[i]);
      live[i] = live[--nlive];
    }
  }
  free(live);
  return st;
}

/* ---- adversarial ------------------------------------------------------- */

static mpb_param_t mpb_adv_params[] = {
    {"seed", false, 1, 0, UINT64_MAX, "unused: the pattern is fixed"},
    {"rounds", false, 24, 1, 10000, "rounds of growing requests"},
    {"count", false, 16, 1, 100000, "big blocks per round"},
    {"size", true, (uint64_t)4 << 20, 1, (uint64_t)1 << 40,
     "big block size of the first round"},
    {"growth", false, 6, 0, 1000, "percent each round's size grows by"},
    {"pin", true, (uint64_t)64 << 10, 1, (uint64_t)1 << 40,
     "small long-lived block after each big one"},
};

/* *size grown by growth percent and one byte (size * growth / 100 without
 * the product, which wraps long before the sum does); false, changing
 * nothing, where the result would not fit a size_t. */
static bool mpb_adv_grow(size_t *size, uint64_t growth) {
  size_t s = *size, extra = (size_t)(s % 100 * growth / 100 + 1);
  if (growth != 0 && s / 100 > (SIZE_MAX - extra) / growth)
    return false;
  size_t add = (size_t)(s / 100 * growth) + extra;
  if (add > SIZE_MAX - s)
    return false;
  *size = s + add;
  return true;
}

static mp_status_t mpb_gen_adversarial(mpb_workload_t *w,
                                       const mpb_params_t *ps) {
  size_t count = mpb_param(ps, "count");
  size_t size = mpb_param(ps, "size");
  size_t pin = mpb_param(ps, "pin");
  uint64_t growth = mpb_param(ps, "growth");
  uint32_t *big = malloc(count * sizeof *big);
  if (big == NULL)
    return mp__fail(MP_ENOMEM, "adversarial: out of host memory");
  mp_status_t st = MP_OK;
  for (uint64_t r = 0; r < mpb_param(ps, "rounds") && st == MP_OK; r++) {
    if (r > 0 && !mpb_adv_grow(&size, growth)) {
      st =
          mp__fail(MP_EINVAL,
                   "workload adversarial: round %llu's block size (%zu "
                   "bytes grown by growth=%llu%%) exceeds the address space",
                   (unsigned long long)r + 1, size, (unsigned long long)growth);
      break;
    }
    /* A best fit puts each big block in the lowest hole that holds it and
     * the pin right after it; freeing the big ones leaves holes fenced by
     * pins, and the next round's slightly bigger blocks fit none of them. */
    uint32_t p;
    for (size_t i = 0; i < count && st == MP_OK; i++)
      if ((st = mpb_workload_alloc(w, size, 0, &big[i])) == MP_OK)
        st = mpb_workload_alloc(w, pin, 0, &p);
    for (size_t i = 0; i < count && st == MP_OK; i++)
      st = mpb_workload_free_slot(w, big[i]);
  }
  free(big);
  return st;
}

/* ---- staging -------------------------------------------------------------
 */

static mpb_param_t mpb_staging_params[] = {
    {"seed", false, 1, 0, UINT64_MAX, "PRNG seed"},
    {"steps", false, 2000, 1, 10000000, "engine steps"},
    {"max_batch", false, 64, 1, 4096, "sequences per step from 1..max_batch"},
    {"max_tokens", false, 2048, 1, 1000000,
     "tokens per sequence staged in, from 1..max_tokens"},
    {"vocab", false, 32000, 1, 1000000, "vocabulary (log-probs staged out)"},
    {"kv_block", true, (uint64_t)160 << 10, 1, (uint64_t)1 << 30,
     "bytes of one offloaded KV block"},
    {"max_blocks", false, 48, 1, 100000, "blocks per offload from 1..max"},
    {"max_hold", false, 64, 1, 100000,
     "steps an offload stays, from 1..max_hold"},
};

typedef struct mpb_offload {
  uint32_t slot;
  uint64_t until; /* the step it is swapped back in */
} mpb_offload_t;

static mp_status_t mpb_gen_staging(mpb_workload_t *w, const mpb_params_t *ps) {
  uint64_t rng = mpb_param(ps, "seed");
  uint64_t steps = mpb_param(ps, "steps");
  size_t max_hold = mpb_param(ps, "max_hold");
  /* At most one offload starts per step, so max_hold bound the live ones. */
  mpb_offload_t *off = malloc((max_hold + 1) * sizeof *off);
  if (off == NULL)
    return mp__fail(MP_ENOMEM, "staging: out of host memory");
  size_t noff = 0;
  mp_status_t st = MP_OK;
  for (uint64_t step = 0; step < steps && st == MP_OK; step++) {
    size_t batch = mpb_rand_range(&rng, 1, mpb_param(ps, "max_batch"));
    size_t tokens = mpb_rand_range(&rng, 1, mpb_param(ps, "max_tokens"));
    /* Prefill steps stage many tokens; most steps decode one each. */
    if (mpb_rand(&rng) % 4 != 0)
      tokens = 1;
    uint32_t ids, pos, out, lp = 0;
    bool logprobs = mpb_rand(&rng) % 8 == 0;
    if ((st = mpb_workload_alloc(w, batch * tokens * 8, 0, &ids)) != MP_OK ||
        (st = mpb_workload_alloc(w, batch * tokens * 4, 0, &pos)) != MP_OK ||
        (st = mpb_workload_alloc(w, batch * 8, 0, &out)) != MP_OK)
      break;
    if (logprobs &&
        (st = mpb_workload_alloc(w, batch * mpb_param(ps, "vocab") * 4, 0,
                                 &lp)) != MP_OK)
      break;
    /* Swap-ins due now, then maybe an offload of a run of blocks. */
    for (size_t i = 0; i < noff && st == MP_OK;) {
      if (off[i].until <= step) {
        st = mpb_workload_free_slot(w, off[i].slot);
        off[i] = off[--noff];
      } else {
        i++;
      }
    }
    if (st == MP_OK && noff < max_hold && mpb_rand(&rng) % 4 == 0) {
      size_t blocks = mpb_rand_range(&rng, 1, mpb_param(ps, "max_blocks"));
      off[noff].until = step + mpb_rand_range(&rng, 1, max_hold);
      st = mpb_workload_alloc(w, blocks * mpb_param(ps, "kv_block"), 0,
                              &off[noff].slot);
      noff += st == MP_OK;
    }
    /* The step's copies are done: its staging buffers go. */
    if (st == MP_OK && logprobs)
      st = mpb_workload_free_slot(w, lp);
    if (st == MP_OK && (st = mpb_workload_free_slot(w, out)) == MP_OK &&
        (st = mpb_workload_free_slot(w, pos)) == MP_OK)
      st = mpb_workload_free_slot(w, ids);
  }
  free(off);
  return st;
}

/* ---- graph ---------------------------------------------------------------
 * A serving engine with CUDA graphs (vLLM's, SGLang's): weights and a KV
 * cache first, then one decode step captured per batch size (largest
 * first, all into one graph pool, as vLLM shares one), each step's layer
 * temporaries allocated and freed on the capturing stream and its logits
 * kept as the graph's output; then serving on the eager stream (prefills of
 * random length, whose temporaries come and go; decode steps are replays,
 * which allocate nothing) until the graphs are destroyed, and a few steps
 * after that. Stream 0 serves, stream 1 captures. */

static mpb_param_t mpb_graph_params[] = {
    {"seed", false, 1, 0, UINT64_MAX, "PRNG seed"},
    {"steps", false, 400, 1, 10000000, "serving steps"},
    {"layers", false, 16, 1, 1000, "transformer layers"},
    {"hidden", false, 1024, 64, 65536, "hidden size (fp16 elements)"},
    {"vocab", false, 32000, 1, 1000000, "vocabulary (logits per token)"},
    {"max_batch", false, 64, 1, 4096,
     "largest captured batch (1, 2, 4, ... up to it)"},
    {"max_prompt", false, 512, 1, 1000000, "prefill tokens from 1..max_prompt"},
    {"kv_cache", true, (uint64_t)256 << 20, 1, (uint64_t)1 << 44,
     "KV cache bytes"},
};

/* One decode (or prefill) step over `tokens` tokens on stream: per layer a
 * qkv, an attention output and an MLP activation, the previous layer's
 * freed as the next one's are made; the logits stay (*out). */
static mp_status_t mpb_graph_step(mpb_workload_t *w, const mpb_params_t *ps,
                                  size_t tokens, uint16_t stream,
                                  uint32_t *out) {
  size_t h = mpb_param(ps, "hidden") * 2 * tokens;
  uint32_t prev[3], cur[3];
  bool have = false;
  for (uint64_t l = 0; l < mpb_param(ps, "layers"); l++) {
    MPB_TRY(mpb_workload_alloc(w, 3 * h, stream, &cur[0]));
    MPB_TRY(mpb_workload_alloc(w, h, stream, &cur[1]));
    MPB_TRY(mpb_workload_alloc(w, 4 * h, stream, &cur[2]));
    for (int k = 0; have && k < 3; k++)
      MPB_TRY(mpb_workload_free_slot(w, prev[k]));
    memcpy(prev, cur, sizeof prev);
    have = true;
  }
  MPB_TRY(
      mpb_workload_alloc(w, tokens * mpb_param(ps, "vocab") * 4, stream, out));
  for (int k = 0; have && k < 3; k++)
    MPB_TRY(mpb_workload_free_slot(w, prev[k]));
  return MP_OK;
}

static mp_status_t mpb_gen_graph(mpb_workload_t *w, const mpb_params_t *ps) {
  uint64_t rng = mpb_param(ps, "seed");
  size_t hidden = mpb_param(ps, "hidden");
  uint32_t weights, kv, logits, outs[16];
  unsigned nout = 0;
  MPB_TRY(mpb_workload_alloc(
      w, mpb_param(ps, "layers") * 12 * hidden * hidden * 2, 0, &weights));
  MPB_TRY(mpb_workload_alloc(w, mpb_param(ps, "kv_cache"), 0, &kv));
  /* Warm-up on the capturing stream, then the captures. */
  size_t top = 1;
  while (top * 2 <= mpb_param(ps, "max_batch"))
    top *= 2;
  MPB_TRY(mpb_graph_step(w, ps, top, 1, &logits));
  MPB_TRY(mpb_workload_free_slot(w, logits));
  for (size_t b = top; b >= 1 && nout < 16; b /= 2) {
    MPB_TRY(mpb_workload_graph(w, MPB_CAPTURE_BEGIN, 1));
    MPB_TRY(mpb_graph_step(w, ps, b, 1, &outs[nout++]));
    MPB_TRY(mpb_workload_graph(w, MPB_CAPTURE_END, 1));
  }
  uint64_t steps = mpb_param(ps, "steps");
  for (uint64_t i = 0; i < steps + steps / 8; i++) {
    if (i == steps) { /* the engine drops its graphs */
      for (unsigned k = 0; k < nout; k++)
        MPB_TRY(mpb_workload_free_slot(w, outs[k]));
      MPB_TRY(mpb_workload_graph(w, MPB_GRAPH_RELEASE, 1));
    }
    if (mpb_rand(&rng) % 4 != 0)
      continue; /* a decode step: a replay, nothing allocated */
    size_t tokens = mpb_rand_range(&rng, 1, mpb_param(ps, "max_prompt"));
    MPB_TRY(mpb_graph_step(w, ps, tokens, 0, &logits));
    MPB_TRY(mpb_workload_free_slot(w, logits));
  }
  MPB_TRY(mpb_workload_free_slot(w, kv));
  return mpb_workload_free_slot(w, weights);
}

/* ---- colocate ------------------------------------------------------------
 * Two tenants (an RLHF trainer and an inference engine) take turns on one
 * device: each fills its pool, and at each turn the active one pauses
 * (content kept) and the other resumes and replaces some of its blocks. */

static mpb_param_t mpb_colocate_params[] = {
    {"seed", false, 1, 0, UINT64_MAX, "PRNG seed"},
    {"size", true, (uint64_t)256 << 20, (uint64_t)1 << 20, (uint64_t)1 << 40,
     "live bytes of each tenant"},
    {"rounds", false, 3, 1, 10000, "turns each tenant takes"},
    {"churn", false, 8, 0, 100000, "blocks a tenant replaces in its turn"},
};

typedef struct mpb_tenant_set {
  uint32_t *slot;
  size_t n;
} mpb_tenant_set_t;

/* A block size a tenant uses: mostly 1-8 MiB, a quarter 16-64 MiB. */
static size_t mpb_colocate_size(uint64_t *rng) {
  size_t mib = mpb_rand(rng) % 4 == 0 ? mpb_rand_range(rng, 16, 64)
                                      : mpb_rand_range(rng, 1, 8);
  return mib << 20;
}

static mp_status_t mpb_colocate_add(mpb_workload_t *w, mpb_tenant_set_t *t,
                                    size_t bytes, size_t cap) {
  uint32_t slot;
  MPB_TRY(mpb_workload_alloc(w, bytes, 0, &slot));
  if (t->n == cap)
    return mp__fail(MP_EINVAL, "colocate: too many blocks");
  t->slot[t->n++] = slot;
  return MP_OK;
}

static mp_status_t mpb_gen_colocate(mpb_workload_t *w, const mpb_params_t *ps) {
  uint64_t rng = mpb_param(ps, "seed");
  size_t size = mpb_param(ps, "size");
  size_t cap = size / ((size_t)1 << 20) + 2;
  mpb_tenant_set_t t[2] = {{calloc(cap, sizeof(uint32_t)), 0},
                           {calloc(cap, sizeof(uint32_t)), 0}};
  mp_status_t st = t[0].slot && t[1].slot
                       ? MP_OK
                       : mp__fail(MP_ENOMEM, "colocate: out of host memory");
  /* Fill: the trainer, paused, then the engine. */
  for (uint8_t k = 0; k < 2 && st == MP_OK; k++) {
    w->tenant = k;
    size_t filled = 0;
    while (st == MP_OK && filled < size) {
      size_t b = mpb_colocate_size(&rng);
      if (b > size - filled)
        b = size - filled;
      st = mpb_colocate_add(w, &t[k], b, cap);
      filled += b;
    }
    if (st == MP_OK && k == 0)
      st = mpb_workload_turn(w, MPB_PAUSE, 0);
  }
  /* Turns: the active tenant pauses, the other resumes and churns. */
  uint64_t turns = 2 * mpb_param(ps, "rounds");
  for (uint64_t r = 0; r < turns && st == MP_OK; r++) {
    uint8_t on = (uint8_t)(r % 2 == 0 ? 0 : 1), off = (uint8_t)(1 - on);
    st = mpb_workload_turn(w, MPB_PAUSE, off);
    if (st == MP_OK)
      st = mpb_workload_turn(w, MPB_RESUME, on);
    w->tenant = on;
    for (uint64_t c = 0; c < mpb_param(ps, "churn") && st == MP_OK; c++) {
      if (t[on].n == 0)
        break;
      size_t i = mpb_rand(&rng) % t[on].n;
      size_t b = w->slot_size[t[on].slot[i]];
      st = mpb_workload_free_slot(w, t[on].slot[i]);
      t[on].slot[i] = t[on].slot[--t[on].n];
      if (st == MP_OK) /* the same bytes, cut differently */
        st = mpb_colocate_add(w, &t[on], b, cap);
    }
  }
  /* The active tenant (the engine after the last turn) finishes first and
   * pauses, which gives its cache back, so the two are never on the device
   * together. */
  uint8_t last = turns % 2 == 0 ? 1 : 0;
  w->tenant = last;
  for (size_t i = 0; i < t[last].n && st == MP_OK; i++)
    st = mpb_workload_free_slot(w, t[last].slot[i]);
  if (st == MP_OK)
    st = mpb_workload_turn(w, MPB_PAUSE, last);
  if (st == MP_OK)
    st = mpb_workload_turn(w, MPB_RESUME, (uint8_t)(1 - last));
  w->tenant = (uint8_t)(1 - last);
  free(t[0].slot);
  free(t[1].slot);
  return st;
}

/* ---- the table ------------------------------------------------------------
 */

typedef struct mpb_builtin {
  const char *name;
  const char *what;
  mpb_param_t *params;
  size_t nparams;
  mp_status_t (*gen)(mpb_workload_t *w, const mpb_params_t *ps);
} mpb_builtin_t;

#define MPB_N(a) (sizeof(a) / sizeof((a)[0]))
static const mpb_builtin_t mpb_builtins[] = {
    {"llm",
     "LLM serving: weights, requests, per-layer temporaries, and\n"
     "               KV caches grown by concatenation",
     mpb_llm_params, MPB_N(mpb_llm_params), mpb_gen_llm},
    {"cnn", "CNN inference with a changing batch size", mpb_cnn_params,
     MPB_N(mpb_cnn_params), mpb_gen_cnn},
    {"random",
     "random sizes and frees under a live-bytes cap (as RMM's\n"
     "               random_allocations)",
     mpb_random_params, MPB_N(mpb_random_params), mpb_gen_random},
    {"adversarial", "growing blocks fenced by pins: no hole ever fits again",
     mpb_adv_params, MPB_N(mpb_adv_params), mpb_gen_adversarial},
    {"staging",
     "a serving engine's page-locked staging buffers: inputs,\n"
     "               outputs and offloaded KV blocks (host-* allocators)",
     mpb_staging_params, MPB_N(mpb_staging_params), mpb_gen_staging},
    {"graph",
     "a serving engine that captures its decode steps in CUDA\n"
     "               graphs (one graph pool) and replays them while serving",
     mpb_graph_params, MPB_N(mpb_graph_params), mpb_gen_graph},
    {"colocate",
     "two pools take turns on one device through pause and resume\n"
     "               (content kept; an RLHF trainer and an engine): the\n"
     "               figures include ms per GiB of a pause and a resume",
     mpb_colocate_params, MPB_N(mpb_colocate_params), mpb_gen_colocate},
};

const char *const mpb_builtin_names[] = {"llm",         "cnn",     "random",
                                         "adversarial", "staging", "graph",
                                         "colocate",    NULL};

void mpb_workload_help(FILE *out) {
  for (size_t i = 0; i < MPB_N(mpb_builtins); i++) {
    const mpb_builtin_t *b = &mpb_builtins[i];
    fprintf(out, "  %-12s %s\n", b->name, b->what);
    for (size_t j = 0; j < b->nparams; j++) {
      const mpb_param_t *p = &b->params[j];
      char buf[32];
      if (p->is_size)
        mp__fmt_bytes(buf, sizeof buf, p->value);
      else
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)p->value);
      fprintf(out, "      %-11s %s (default %s)\n", p->key, p->help, buf);
    }
  }
}

/* The built-in workload spec names (*out) and its parameters, defaults
 * overridden by spec's, into ps (params: room for 16); MP_EINVAL naming
 * what is wrong. */
static mp_status_t mpb_workload_spec(const char *spec,
                                     const mpb_builtin_t **out,
                                     mpb_param_t *params, mpb_params_t *ps) {
  const char *colon = strchr(spec, ':');
  size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
  const mpb_builtin_t *b = NULL;
  for (size_t i = 0; i < MPB_N(mpb_builtins); i++)
    if (strlen(mpb_builtins[i].name) == len &&
        memcmp(mpb_builtins[i].name, spec, len) == 0)
      b = &mpb_builtins[i];
  if (b == NULL) {
    char known[128] = "";
    size_t n = 0;
    for (size_t i = 0; i < MPB_N(mpb_builtins) && n < sizeof known; i++)
      n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", i ? ", " : "",
                            mpb_builtins[i].name);
    return mp__fail(MP_EINVAL, "unknown workload '%.*s' (built-in: %s)",
                    (int)len, spec, known);
  }
  memcpy(params, b->params, b->nparams * sizeof *params);
  *ps = (mpb_params_t){b->name, params, b->nparams};
  *out = b;
  return mp__kv_each("workload parameters", colon ? colon + 1 : NULL,
                     mpb_param_set, ps);
}

mp_status_t mpb_workload_check(const char *spec) {
  if (spec == NULL)
    return mp__fail(MP_EINVAL, "mpb_workload_check: NULL argument");
  const mpb_builtin_t *b;
  mpb_param_t params[16];
  mpb_params_t ps;
  return mpb_workload_spec(spec, &b, params, &ps);
}

mp_status_t mpb_workload_generate(const char *spec, mpb_workload_t *out) {
  if (spec == NULL || out == NULL)
    return mp__fail(MP_EINVAL, "mpb_workload_generate: NULL argument");
  const mpb_builtin_t *b;
  mpb_param_t params[16];
  mpb_params_t ps;
  MPB_TRY(mpb_workload_spec(spec, &b, params, &ps));
  mpb_workload_init(out, spec);
  out->max_events = MPB_MAX_GENERATED_EVENTS;
  mp_status_t st = b->gen(out, &ps);
  if (st == MP_OK)
    st = mpb_workload_drain(out);
  if (st != MP_OK)
    mpb_workload_free(out);
  return st;
}
