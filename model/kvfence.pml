/* kvfence writer-lifetime protocol (docs/design.md sec. 2-3) -- Promela model.
   One decode, NR=2 prefill ranks, one KV slot, NG admissions (tags) that reuse the slot.
   Tag = gen (globally unique across decode instances, so gen also stands for (instance,gen)).
   Time: Tick process decrements all countdown timers at once.
   Options (-D): see README.md (kept in the repo with check.sh, which runs the safe
   configurations and every known-unsafe variant). */

#define NR 2
#ifndef NG
#define NG 2
#endif
#ifndef TAIL
#define TAIL 2          /* a posted write may move for TAIL ticks (MaxTail honest) */
#endif
#ifndef TAIL1
#define TAIL1 TAIL      /* rank 1's own transport tail, declared to decode (rank 0's is TAIL) */
#endif
#ifdef UNB0
/* rank 0's transport declares an unbounded tail: its write is posted with tl = 0, which
   never clears mv by time (Tick clears mv only when tl counts down to 0), and decode never
   times out a hold over it. Only the restart fence (RESTART) ends such a hold. */
#define TAILR(r) ((r) == 1 -> TAIL1 : 0)
#else
#define TAILR(r) ((r) == 1 -> TAIL1 : TAIL)
#endif
#ifndef LEASE
#define LEASE 2         /* lease granted by decode, in decode ticks */
#endif
#ifndef SKEW
#define SKEW 0          /* rank clock lags decode clock by SKEW ticks */
#endif
#ifndef MARGIN
#define MARGIN SKEW     /* clock margin in decode's deadline */
#endif
#ifndef BOUND
#define BOUND (LEASE + TAIL - 1 + MARGIN)   /* tight bound for these discrete semantics */
#endif
/* decode bounds each writer by that writer's declared tail (RankTail) */
#ifdef M_OWN_TAIL
#define BOUNDR(r) BOUND                      /* mutant: decode's own tail for every writer */
#define BOUNDMAX BOUND
#else
#define BOUNDR(r) (BOUND + TAILR(r) - TAIL)
#define BOUNDMAX (BOUND + (TAIL1 > TAIL -> TAIL1 - TAIL : 0))
#endif
#ifndef LOSS
#define LOSS 1
#endif
#ifndef DUP
#define DUP 1
#endif
#ifndef CRASH
#define CRASH 1
#endif
#ifndef MAXHB
#define MAXHB 1
#endif
#ifndef DRST
#define DRST 0          /* decode restarts allowed */
#endif
#ifndef TRUNC
#define TRUNC 1         /* a rank may post a write that covers fewer pages than assigned */
#endif

#define GN (NG+1)
#define IX(r,g) ((r)*GN+(g))
#define NW (NR*GN)
/* decode exposure states */
#define D_FREE 0
#define D_ASSIGNED 1
#define D_ABORTING 2
#define D_HANDED 3
/* rank per-tag states */
#define R_IDLE 0
#define R_SENDING 1
#define R_COMMITTED 2
#define R_FAILED 3
#define R_DRAINING 4
#define R_ACKED 5
/* write (batch) status */
#define W_NONE 0
#define W_INFL 1
#define W_SUCC 2
#define W_FDEF 3
#define W_INDOUBT 4
#define W_QUIESCED 5
/* messages */
#define ASG 0
#define ABT 1
#define GRT 2
#define CMT 0
#define FAL 1
#define DAK 2
#define HBT 3
#define MR(t,r,g) ((t)*NW+IX(r,g))
#define MD(t,r,g) ((t)*NW+IX(r,g))

byte dst = D_FREE;      /* slot/exposure state at decode */
byte cur = 0;           /* tag currently owning the slot */
byte room[GN];
bit committed[NR];
bit acked[NR];
byte dl[NR];            /* decode deadline per rank (countdown) */
byte dq = 0;            /* decode restart quarantine (countdown) */
byte drb = DRST;
byte issued[NW];        /* latest lease end decode granted for (r,g), countdown in decode clock */
byte aissued[NW];       /* lease end carried by the Assign itself (countdown) */
byte rs[NW];            /* rank state per tag */
byte ws[NW];            /* write status per (r,g) */
bit  mv[NW];            /* write may still move bytes */
byte tl[NW];            /* remaining tail of the write */
byte lr[NW];            /* rank's own lease countdown (rank clock) */
bit  landed[NW];        /* every assigned page of (r,g) landed with success */
bit  trunc[NW];         /* (r,g)'s write covers fewer pages than assigned; the Commit's coverage says so */
bit  gcomm[NW];         /* ghost: rank really committed (r,g) */
byte hbc[NW];
bit  revoked[GN];
bit  aborted[GN];       /* ghost */
bit  crashed[NR];
byte lossb = LOSS;
byte dupb = DUP;
byte crashb = CRASH;
bit toR[3*NW];
bit toD[4*NW];
bit viol = 0;           /* ghost for LTL */
#ifdef RESTART
/* restart fence: two target plugin instances serve decode; each tag is bound at admission
   to one that is not restarting; rq[i]: a restart of instance i was asked for, its process
   not yet reaped. The reap stops every write of every tag bound to it (revoked[g]). */
#define NT 2
byte tgt[GN];
bit rq[NT];
#define ADMITTING && !(rq[0] && rq[1])   /* Admit refuses while every instance restarts */
#else
#define ADMITTING
#endif
/* names that appear in spin's "assertion violated" line (hidden: not in the state vector) */
hidden byte I1_isolation = 1;
hidden byte I2_handoff_all_committed = 1;
hidden byte I2_handoff_full_coverage = 1;
hidden byte I2_handoff_not_aborted = 1;
hidden byte I4_stale_tag = 1;
hidden byte I5_failed_not_complete = 1;

#define OK(g) ((cur == (g) && (dst == D_ASSIGNED || dst == D_ABORTING)) || (dq > 0 && dst == D_FREE))

#ifdef M_IGNORE_GEN
#define MATCH(g) (dst != D_FREE && room[g] == room[cur])
#else
#define MATCH(g) (dst != D_FREE && (g) == cur)
#endif

#ifdef M_ONE_ACK
#define ALLACK (acked[0] || acked[1])
#define TOREL ((acked[0] || acked[1]) || (dl[0] == 0 && dl[1] == 0))
#else
#define ALLACK (acked[0] && acked[1])
#ifdef UNB0
#define TOREL (acked[0] && (acked[1] || dl[1] == 0))   /* no time bound over rank 0's writes */
#else
#define TOREL ((acked[0] || dl[0] == 0) && (acked[1] || dl[1] == 0))
#endif
#endif

byte npend = 0;          /* number of distinct messages in flight (function of the bits) */
/* canonicalisation of irrelevant variables (exact w.r.t. the checked properties) */
c_code {
void cnorm(void) {
  int r, g, k, t;
  for (r = 0; r < NR; r++) for (g = 1; g <= NG; g++) {
    k = r*GN + g;
    if (!now.mv[k]) now.tl[k] = 0;
    if (!(now.cur == g && (now.dst == D_ASSIGNED || now.dst == D_ABORTING))) now.landed[k] = 0;
    if (g != now.cur) now.gcomm[k] = 0;
    /* coverage matters while the write may land, before the rank commits, or while its Commit is in flight */
    if (!now.mv[k] && !(now.rs[k] == R_SENDING && now.ws[k] == W_SUCC) && !now.toD[CMT*NW + k]) now.trunc[k] = 0;
#ifndef FORGET
    if (now.rs[k] != R_IDLE && !(now.rs[k] == R_SENDING && now.toR[2*NW + k])) now.issued[k] = 0;
    if (now.rs[k] != R_IDLE) now.aissued[k] = 0;
    if (now.rs[k] == R_COMMITTED || now.rs[k] == R_ACKED) {
      now.hbc[k] = 0;
      if (now.ws[k] != W_INFL && now.ws[k] != W_INDOUBT) now.ws[k] = W_QUIESCED;
    }
#endif
#ifdef RESTART
    if (now.revoked[g]) now.mv[k] = 0;   /* reaped: a write bound to it can never land */
#endif
#ifndef M_IGNORE_GEN
    if (g < now.cur) for (t = 0; t < 4; t++) if (now.toD[t*NW + k]) { now.toD[t*NW + k] = 0; now.npend--; }
#endif
  }
#ifndef M_ONE_ACK
  for (r = 0; r < NR; r++) if (now.acked[r] || now.committed[r]) now.dl[r] = 0;
#endif
  for (g = 1; g <= NG; g++) if (g != now.cur) now.aborted[g] = 0;
}
}
#ifndef NONORM
#define norm() c_code { cnorm(); }
#else
#define norm() skip
#endif
#define AT(...) atomic { __VA_ARGS__ ; norm() }

inline sendR(t,r,g) {
  if
  :: toR[MR(t,r,g)] == 0 -> toR[MR(t,r,g)] = 1; npend++
  :: toR[MR(t,r,g)] == 1 -> skip
  :: lossb > 0 -> lossb--
  fi
}
inline sendD(t,r,g) {
  if
  :: toD[MD(t,r,g)] == 0 -> toD[MD(t,r,g)] = 1; npend++
  :: toD[MD(t,r,g)] == 1 -> skip
  :: lossb > 0 -> lossb--
  fi
}
inline consR(k) {
  if
  :: toR[k] = 0; npend--
  :: dupb > 0 -> dupb--          /* a copy stays: may be delivered again, any time later */
  fi
}
inline consD(k) {
  if
  :: toD[k] = 0; npend--
  :: dupb > 0 -> dupb--
  fi
}

inline startAbort() {
  aborted[cur] = 1;
#ifdef M_RELEASE_ON_ABORT
  dst = D_FREE; dl[0] = 0; dl[1] = 0;
#else
  dst = D_ABORTING;
  acked[0] = committed[0]; acked[1] = committed[1];   /* Commit implies drained */
#endif
  sendR(ABT,0,cur); sendR(ABT,1,cur)
}

inline release() {
  dst = D_FREE; dl[0] = 0; dl[1] = 0; committed[0] = 0; committed[1] = 0; acked[0] = 0; acked[1] = 0
}

#ifdef NO_COVERAGE
#define SHORT(r,g) 0                 /* mutant: hand off without checking the Commit's coverage */
#else
#define SHORT(r,g) (trunc[IX(r,g)])
#endif

inline dfail(r) {
  if
#ifdef M_RELEASE_ON_REMOTE_FAIL
  :: dst == D_ASSIGNED -> startAbort(); release()   /* mutant: a failure decode did not start frees at once */
  :: dst == D_ABORTING -> release()
#else
  :: dst == D_ASSIGNED -> dl[r] = BOUNDR(r); startAbort()
  :: dst == D_ABORTING -> dl[r] = BOUNDR(r)
#endif
  :: else -> skip
  fi
}

inline dhandle(t,r,g) {
  consD(MD(t,r,g));
  if
  :: MATCH(g) ->
#ifndef NO_I4
     assert(I4_stale_tag && g == cur);          /* I4: a stale-tag message never changes decode state */
#endif
     if
     :: t == CMT && SHORT(r,g) ->  /* coverage short of the assigned pages: like Fail, never hand off */
        dfail(r)
     :: t == CMT && !SHORT(r,g) ->
        if
        :: dst == D_ASSIGNED -> committed[r] = 1
        :: dst == D_ABORTING -> acked[r] = 1
        :: else -> skip
        fi
     :: t == FAL ->
        dfail(r)
     :: t == DAK ->
        if
        :: dst == D_ASSIGNED -> startAbort(); acked[r] = 1
        :: dst == D_ABORTING -> acked[r] = 1
        :: else -> skip
        fi
     :: t == HBT ->
        if
        :: dst == D_ASSIGNED ->
#ifndef M_FORGET_RENEWAL
           dl[r] = BOUNDR(r);           /* the bound counts the lease this answer renews */
#endif
#ifndef ONEWAY
           issued[IX(r,g)] = LEASE; sendR(GRT,r,g)
#else
           skip
#endif
        :: dst == D_ABORTING ->
#ifdef GRANT_IN_ABORTING
           issued[IX(r,g)] = LEASE; sendR(GRT,r,g);
#endif
           dl[r] = BOUNDR(r)            /* evidence of life only: no new posting lease while aborting */
        :: else -> skip
        fi
     fi
  :: else -> skip                   /* stale: counted and logged, nothing else */
  fi
}

#ifdef RESTART
/* instance i's process is reaped: no write bound to it can land any more; the hold of the
   current exposure on it goes back (Released{fenced}); a live one fails first */
inline reap(i) {
  rq[i] = 0;
  revoked[1] = revoked[1] || (tgt[1] == i && cur >= 1);
#if NG >= 2
  revoked[2] = revoked[2] || (tgt[2] == i && cur >= 2);
#endif
#if NG >= 3
  revoked[3] = revoked[3] || (tgt[3] == i && cur >= 3);
#endif
  if
  :: dst == D_ASSIGNED && tgt[cur] == i -> startAbort(); release()
  :: dst == D_ABORTING && tgt[cur] == i -> release()
  :: else -> skip
  fi
}
#endif

#define DRECV(t,r,g) :: AT( toD[MD(t,r,g)] -> dhandle(t,r,g) )
#define DRECVG(g) DRECV(CMT,0,g) DRECV(CMT,1,g) DRECV(FAL,0,g) DRECV(FAL,1,g) \
                  DRECV(DAK,0,g) DRECV(DAK,1,g) DRECV(HBT,0,g) DRECV(HBT,1,g)

active proctype Decode() {
end:
  do
  :: AT( dst == D_FREE && cur < NG && dq == 0 ADMITTING ->
       cur++;
#ifdef M_IGNORE_GEN
       if :: room[cur] = 1 :: room[cur] = 2 fi;
#endif
       dst = D_ASSIGNED;
#ifdef RESTART
       if :: !rq[0] -> tgt[cur] = 0 :: else -> tgt[cur] = 1 fi;   /* the core's choice: the first not restarting */
#endif
       committed[0] = 0; committed[1] = 0; acked[0] = 0; acked[1] = 0;
       dl[0] = BOUNDR(0); dl[1] = BOUNDR(1);
#ifndef ONEWAY
       issued[IX(0,cur)] = LEASE; issued[IX(1,cur)] = LEASE;
       aissued[IX(0,cur)] = LEASE; aissued[IX(1,cur)] = LEASE;
#endif
       sendR(ASG,0,cur); sendR(ASG,1,cur) )
  :: AT( dst == D_ASSIGNED -> startAbort() )               /* abort at any time */
  :: AT( dst == D_ASSIGNED && committed[0] && committed[1] ->
       /* I2: every rank committed under this tag, full coverage, never aborted */
       assert(I2_handoff_all_committed && gcomm[IX(0,cur)] && gcomm[IX(1,cur)]);
       assert(I2_handoff_full_coverage && landed[IX(0,cur)] && landed[IX(1,cur)]);
       assert(I2_handoff_not_aborted && !aborted[cur]);
       dst = D_HANDED; dl[0] = 0; dl[1] = 0 )
#if defined(REVOKE) && !defined(M_RELEASE_ON_DRAIN_ACK)
  /* With a fence, acks are the ranks' word: slots go back only once revoked. */
  :: AT( dst == D_HANDED -> revoked[cur] = 1; release() )  /* request done, fenced, slot back to pool */
  :: AT( dst == D_ABORTING && ALLACK -> revoked[cur] = 1; release() ) /* Released{drained}, after the fence */
#else
  :: AT( dst == D_HANDED -> release() )                    /* request done, slot back to pool */
  :: AT( dst == D_ABORTING && ALLACK -> release() )        /* Released{drained} */
#endif
  :: AT( dst == D_ABORTING && TOREL ->                     /* Released{timeout} */
#ifdef REVOKE
       revoked[cur] = 1;
#endif
       release() )
#ifdef REVOKE
  :: AT( dst == D_ABORTING -> revoked[cur] = 1; release() ) /* Released{fenced} */
#endif
#ifdef RESTART
  /* a hold that must end sooner than its bound (any time: past the threshold, a dead
     writer, an unbounded tail): ask for its instance's restart */
  :: AT( dst == D_ABORTING && !rq[tgt[cur]] -> rq[tgt[cur]] = 1
#ifdef M_RELEASE_BEFORE_REAP
       ; release()                                       /* mutant: holds back before the reap */
#endif
     )
  :: AT( rq[0] -> reap(0) )
  :: AT( rq[1] -> reap(1) )
#endif
#if DRST > 0
  :: AT( drb > 0 && dst != D_FREE -> drb--;                /* decode restart: new instance */
#ifdef DRST_FENCE
       revoked[cur] = 1;
#endif
       release();
#ifdef DRST_QUAR
       dq = BOUNDMAX;
#endif
     )
#endif
  DRECVG(1)
#if NG >= 2
  DRECVG(2)
#endif
#if NG >= 3
  DRECVG(3)
#endif
  od
}

#ifdef LIAR
#define LIAR_R(r) ((r) == 0)     /* the lying rank's acks are not the protocol's: not checked by I5 */
#else
#define LIAR_R(r) 0
#endif
inline sendDAK(r,g) {
#ifndef NO_I5
  assert(I5_failed_not_complete && (LIAR_R(r) || (ws[IX(r,g)] != W_INDOUBT && ws[IX(r,g)] != W_INFL)));  /* I5 */
#endif
  sendD(DAK,r,g)
}

/* rank receive handlers */
#define RASG(r,g) :: AT( toR[MR(ASG,r,g)] -> consR(MR(ASG,r,g)); \
    if \
    :: rs[IX(r,g)] == R_IDLE -> rassign(r,g) \
    :: else -> skip \
    fi )

inline rassign(r,g) {
#ifdef ONEWAY
  lr[IX(r,g)] = LEASE; rs[IX(r,g)] = R_SENDING
#else
  if
  :: aissued[IX(r,g)] > 0 -> lr[IX(r,g)] = aissued[IX(r,g)] + SKEW; rs[IX(r,g)] = R_SENDING
  :: else -> rs[IX(r,g)] = R_FAILED; sendD(FAL,r,g)     /* lease already lapsed: refuse */
  fi
#endif
}

inline rabort(r,g) {
  if
  :: rs[IX(r,g)] == R_IDLE ->
#ifdef FORGET
     sendDAK(r,g)                   /* unknown tag: ack, no tombstone */
#else
     rs[IX(r,g)] = R_ACKED; sendDAK(r,g)   /* tombstone */
#endif
  :: rs[IX(r,g)] == R_SENDING || rs[IX(r,g)] == R_FAILED -> rs[IX(r,g)] = R_DRAINING; lr[IX(r,g)] = 0
  :: rs[IX(r,g)] == R_COMMITTED || rs[IX(r,g)] == R_ACKED ->
#ifdef LIT_COMMITTED
     if :: rs[IX(r,g)] == R_ACKED -> sendDAK(r,g) :: else -> skip fi
#else
     sendDAK(r,g)
#endif
  :: rs[IX(r,g)] == R_DRAINING -> skip
  fi
}
#define RABT(r,g) :: AT( toR[MR(ABT,r,g)] -> consR(MR(ABT,r,g)); rabort(r,g) )

#define RGRT(r,g) :: AT( toR[MR(GRT,r,g)] -> consR(MR(GRT,r,g)); \
    if \
    :: rs[IX(r,g)] == R_SENDING && issued[IX(r,g)] > 0 && issued[IX(r,g)] + SKEW > lr[IX(r,g)] -> \
       lr[IX(r,g)] = issued[IX(r,g)] + SKEW \
    :: else -> skip \
    fi )

/* rank local steps for tag g */
#define RSTEP(r,g) \
  :: AT( rs[IX(r,g)] == R_SENDING && ws[IX(r,g)] == W_NONE && lr[IX(r,g)] > 0 -> \
       ws[IX(r,g)] = W_INFL; mv[IX(r,g)] = 1; tl[IX(r,g)] = TAILR(r); PICKCOV(IX(r,g)) ) \
  :: AT( rs[IX(r,g)] == R_SENDING && ws[IX(r,g)] == W_NONE && lr[IX(r,g)] == 0 -> \
       rs[IX(r,g)] = R_FAILED; sendD(FAL,r,g) ) \
  :: AT( rs[IX(r,g)] == R_SENDING && ws[IX(r,g)] == W_SUCC -> \
       rs[IX(r,g)] = R_COMMITTED; gcomm[IX(r,g)] = 1; lr[IX(r,g)] = 0; sendD(CMT,r,g) ) \
  :: AT( rs[IX(r,g)] == R_SENDING && (ws[IX(r,g)] == W_FDEF || ws[IX(r,g)] == W_INDOUBT) -> \
       rs[IX(r,g)] = R_FAILED; lr[IX(r,g)] = 0; sendD(FAL,r,g) ) \
  :: AT( (rs[IX(r,g)] == R_FAILED || rs[IX(r,g)] == R_DRAINING) && QUIESCABLE(r) && \
              (ws[IX(r,g)] == W_INFL || ws[IX(r,g)] == W_INDOUBT) -> \
       ws[IX(r,g)] = W_QUIESCED; mv[IX(r,g)] = 0 )                 /* Quiesce */ \
  :: AT( (rs[IX(r,g)] == R_FAILED || rs[IX(r,g)] == R_DRAINING) && \
              ws[IX(r,g)] != W_INFL && ws[IX(r,g)] != W_INDOUBT -> \
       rs[IX(r,g)] = R_ACKED; sendDAK(r,g) ) \
  :: AT( (rs[IX(r,g)] == R_SENDING || rs[IX(r,g)] == R_FAILED || rs[IX(r,g)] == R_DRAINING) \
              && hbc[IX(r,g)] < MAXHB -> hbc[IX(r,g)]++; sendD(HBT,r,g); rhb(r,g) ) \
  MUT_ACK(r,g) FORGETSTEP(r,g) LIESTEP(r,g)

#ifdef UNB0
#define QUIESCABLE(r) ((r) != 0)   /* an unbounded write never quiesces: rank 0 cannot drain it */
#else
#define QUIESCABLE(r) 1
#endif

#ifdef LIAR
/* rank 0 lies (buggy or hostile): it acks its drain while its write still moves,
   and the write then keeps moving with no tail (tl = 0 never clears mv) until it
   lands or a fence (revoked) stops it. */
#define LIESTEP(r,g) :: AT( (r) == 0 && (rs[IX(r,g)] == R_FAILED || rs[IX(r,g)] == R_DRAINING) && \
       (ws[IX(r,g)] == W_INFL || ws[IX(r,g)] == W_INDOUBT) && mv[IX(r,g)] -> \
       rs[IX(r,g)] = R_ACKED; tl[IX(r,g)] = 0; sendDAK(r,g) )
#else
#define LIESTEP(r,g)
#endif

#if TRUNC
#define PICKCOV(k) if :: trunc[k] = 0 :: trunc[k] = 1 fi
#else
#define PICKCOV(k) trunc[k] = 0
#endif

inline rhb(r,g) {
#ifdef ONEWAY
  if :: rs[IX(r,g)] == R_SENDING -> lr[IX(r,g)] = LEASE :: else -> skip fi   /* self-renewal */
#else
  skip
#endif
}

#ifdef M_ACK_AFTER_FAIL
#define MUT_ACK(r,g) :: AT( rs[IX(r,g)] == R_FAILED -> rs[IX(r,g)] = R_ACKED; sendDAK(r,g) )
#else
#define MUT_ACK(r,g)
#endif

#ifdef FORGET
/* rank garbage-collects finished tags (no tombstone); FORGET_AFTER_LEASE: only once lease lapsed */
#ifdef FORGET_AFTER_LEASE
#define FGUARD(r,g) && issued[IX(r,g)] == 0 && aissued[IX(r,g)] == 0
#else
#define FGUARD(r,g)
#endif
#define FORGETSTEP(r,g) :: AT( (rs[IX(r,g)] == R_ACKED || rs[IX(r,g)] == R_COMMITTED) \
        && !mv[IX(r,g)] FGUARD(r,g) -> rs[IX(r,g)] = R_IDLE; ws[IX(r,g)] = W_NONE; hbc[IX(r,g)] = 0 )
#else
#define FORGETSTEP(r,g)
#endif

#define RALL(r,g) RASG(r,g) RABT(r,g) RGRT(r,g) RSTEP(r,g)

inline rcrash(r) {
  crashb--; crashed[r] = 1;
  lr[IX(r,1)] = 0; lr[IX(r,NG)] = 0
}

#ifdef SYNC
#define DROPB(k) :: AT( toR[k] -> toR[k] = 0; npend-- )
#define SYNCDROP(r) DROPB(MR(ASG,r,1)) DROPB(MR(ABT,r,1)) DROPB(MR(GRT,r,1)) \
                    DROPB(MR(ASG,r,NG)) DROPB(MR(ABT,r,NG)) DROPB(MR(GRT,r,NG))
#else
#define SYNCDROP(r)
#endif

active proctype Rank0() {
end:
  do
  :: AT( crashb > 0 -> rcrash(0) ); goto dead
  RALL(0,1)
#if NG >= 2
  RALL(0,2)
#endif
#if NG >= 3
  RALL(0,3)
#endif
  od;
dead:
end_dead:
  do
  SYNCDROP(0)
  :: false
  od
}
active proctype Rank1() {
end:
  do
  :: AT( crashb > 0 -> rcrash(1) ); goto dead
  RALL(1,1)
#if NG >= 2
  RALL(1,2)
#endif
#if NG >= 3
  RALL(1,3)
#endif
  od;
dead:
end_dead:
  do
  SYNCDROP(1)
  :: false
  od
}

/* transport: completions and landings for write (r,g) */
inline land(k,g) {
  if
  :: !OK(g) -> viol = 1
  :: else -> skip
  fi;
  assert(I1_isolation && OK(g));        /* I1: lands only in memory whose current exposure is its tag */
  if :: !trunc[k] -> landed[k] = 1 :: else -> skip fi
}
#define TW(r,g) \
  :: AT( ws[IX(r,g)] == W_INFL && mv[IX(r,g)] && !revoked[g] -> land(IX(r,g),g); \
       ws[IX(r,g)] = W_SUCC; SUCCMV(r,g) ) \
  :: AT( ws[IX(r,g)] == W_INFL -> ws[IX(r,g)] = W_FDEF; mv[IX(r,g)] = 0 ) \
  :: AT( ws[IX(r,g)] == W_INFL -> ws[IX(r,g)] = W_INDOUBT ) \
  :: AT( mv[IX(r,g)] && !revoked[g] && !OK(g) -> land(IX(r,g),g) )
#ifdef LATEDUP
#define SUCCMV(r,g) skip        /* a resent slice may still land after Succeeded */
#else
#define SUCCMV(r,g) mv[IX(r,g)] = 0
#endif

active proctype Transport() {
end:
  do
  TW(0,1) TW(1,1)
#if NG >= 2
  TW(0,2) TW(1,2)
#endif
#if NG >= 3
  TW(0,3) TW(1,3)
#endif
  od
}

/* time */
#define T1(k) (lr[k] > 0 || tl[k] > 0 || issued[k] > 0 || aissued[k] > 0)
#if NG >= 2
#define ANYT (dl[0] > 0 || dl[1] > 0 || dq > 0 || T1(1) || T1(2) || T1(GN+1) || T1(GN+2))
#else
#define ANYT (dl[0] > 0 || dl[1] > 0 || dq > 0 || T1(1) || T1(GN+1))
#endif

#ifdef SYNC
#define SYNCGUARD && npend == 0      /* every message is delivered or lost within one tick */
#else
#define SYNCGUARD
#endif

active proctype Tick() {
  byte k;
end:
  do
  :: d_step { ANYT SYNCGUARD ->
       if :: dl[0] > 0 -> dl[0]-- :: else -> skip fi;
       if :: dl[1] > 0 -> dl[1]-- :: else -> skip fi;
       if :: dq > 0 -> dq-- :: else -> skip fi;
       k = 0;
       do
       :: k < NW ->
          if :: lr[k] > 0 -> lr[k]-- :: else -> skip fi;
          if :: issued[k] > 0 -> issued[k]-- :: else -> skip fi;
          if :: aissued[k] > 0 -> aissued[k]-- :: else -> skip fi;
          if :: tl[k] > 0 -> tl[k]--; if :: tl[k] == 0 -> mv[k] = 0 :: else -> skip fi
             :: else -> skip fi;
          k++
       :: else -> break
       od;
       k = 0; norm() }
  od
}

#ifdef LTL_LIVE
ltl live { [] ((dst == D_ABORTING) -> <> (dst == D_FREE)) }
#endif
