// kvfence's MORI-IO shim (see kvfence_mori_shim.h): this project's own C++
// over MORI-IO's public C++ API (mori::io::IOEngine). Built only by
// `make mori-shim` where MORI's headers and libmori_io.so exist
// (MORI_HOME); never built in CI. Compiled (C++20) against MORI 624002c8's
// headers, NOT YET LINKED OR RUN against a real libmori_io.so.
#if !__has_include(<mori/io/engine.hpp>)
#error "MORI-IO headers not found: set MORI_HOME (make mori-shim)"
#endif

#include "kvfence_mori_shim.h"

#include <mori/io/engine.hpp>
#include <msgpack.hpp>

#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace {

using mori::io::EngineDesc;
using mori::io::MemoryDesc;
using mori::io::StatusCode;
using mori::io::TransferStatus;

struct Peer {
  EngineDesc desc;
  std::vector<MemoryDesc> mems;
};

// What a peer loads: our engine and our registered memory.
struct Published {
  EngineDesc engine;
  std::vector<MemoryDesc> mems;
  MSGPACK_DEFINE(engine, mems);
};

struct Engine {
  std::unique_ptr<mori::io::IOEngine> io;
  std::mutex mu;
  std::map<uintptr_t, MemoryDesc> local;  // by base address
  std::map<std::string, Peer> peers;
};

struct Batch {
  // MORI writes into a caller-owned TransferStatus until the transfer
  // ends: they live here, and the batch is freed only when none runs.
  std::vector<std::unique_ptr<TransferStatus>> status;
};

const MemoryDesc* covering(const std::map<uintptr_t, MemoryDesc>& m, uintptr_t addr, uint64_t len) {
  auto it = m.upper_bound(addr);
  if (it == m.begin()) return nullptr;
  --it;
  const MemoryDesc& d = it->second;
  if (addr - d.data > d.size || len > d.size - (addr - d.data)) return nullptr;
  return &d;
}

}  // namespace

extern "C" {

int kvf_mori_abi(void) { return KVF_MORI_ABI; }

void* kvf_mori_open(const char* host, int port, const char* backend, char* err, size_t errlen) {
  try {
    if (std::string(backend) != "rdma") throw std::runtime_error("only the rdma backend is supported");
    auto e = std::make_unique<Engine>();
    std::ostringstream key;
    key << "kvfence-" << host << "-" << ::getpid();
    mori::io::IOEngineConfig cfg{host, static_cast<uint16_t>(port)};
    e->io = std::make_unique<mori::io::IOEngine>(key.str(), cfg);
    mori::io::RdmaBackendConfig rc;
    e->io->CreateBackend(mori::io::BackendType::RDMA, rc);
    return e.release();
  } catch (const std::exception& x) {
    std::snprintf(err, errlen, "%s", x.what());
    return nullptr;
  }
}

int kvf_mori_name(void* engine, char* buf, size_t n) {
  auto* e = static_cast<Engine*>(engine);
  std::string k = e->io->GetEngineDesc().key;
  if (k.size() >= n) return -1;
  std::memcpy(buf, k.c_str(), k.size() + 1);
  return 0;
}

int kvf_mori_metadata(void* engine, void* buf, size_t cap, size_t* len) {
  auto* e = static_cast<Engine*>(engine);
  Published p;
  {
    std::lock_guard<std::mutex> l(e->mu);
    p.engine = e->io->GetEngineDesc();
    for (auto& kv : e->local) p.mems.push_back(kv.second);
  }
  msgpack::sbuffer sb;
  msgpack::pack(sb, p);
  *len = sb.size();
  if (sb.size() > cap) return -1;
  std::memcpy(buf, sb.data(), sb.size());
  return 0;
}

int kvf_mori_register(void* engine, uintptr_t addr, size_t len) {
  auto* e = static_cast<Engine*>(engine);
  try {
    MemoryDesc d = e->io->RegisterMemory(reinterpret_cast<void*>(addr), len, -1, mori::io::MemoryLocationType::CPU);
    std::lock_guard<std::mutex> l(e->mu);
    e->local[addr] = d;
    return 0;
  } catch (...) {
    return -1;
  }
}

int kvf_mori_deregister(void* engine, uintptr_t addr) {
  auto* e = static_cast<Engine*>(engine);
  std::lock_guard<std::mutex> l(e->mu);
  auto it = e->local.find(addr);
  if (it == e->local.end()) return -2;
  e->io->DeregisterMemory(it->second);
  e->local.erase(it);
  return 0;
}

int kvf_mori_load_peer(void* engine, const void* md, size_t len, char* name, size_t n) {
  auto* e = static_cast<Engine*>(engine);
  try {
    msgpack::object_handle oh = msgpack::unpack(static_cast<const char*>(md), len);
    Published p = oh.get().as<Published>();
    if (p.engine.key.size() >= n) return -1;
    std::lock_guard<std::mutex> l(e->mu);
    if (e->peers.find(p.engine.key) == e->peers.end()) e->io->RegisterRemoteEngine(p.engine);
    e->peers[p.engine.key] = Peer{p.engine, p.mems};
    std::memcpy(name, p.engine.key.c_str(), p.engine.key.size() + 1);
    return 0;
  } catch (...) {
    return -1;
  }
}

void* kvf_mori_submit(void* engine, const char* peer, const uintptr_t* src, const uint64_t* dst, const uint64_t* len,
                      size_t n, int* err) {
  auto* e = static_cast<Engine*>(engine);
  std::lock_guard<std::mutex> l(e->mu);
  auto pit = e->peers.find(peer);
  if (pit == e->peers.end()) { *err = -2; return nullptr; }
  std::map<uintptr_t, MemoryDesc> remote;
  for (auto& d : pit->second.mems) remote[d.data] = d;
  std::vector<const MemoryDesc*> ls(n), rs(n);
  for (size_t i = 0; i < n; i++) {  // check everything before starting anything
    ls[i] = covering(e->local, src[i], len[i]);
    rs[i] = covering(remote, dst[i], len[i]);
    if (!ls[i] || !rs[i]) { *err = -1; return nullptr; }
  }
  auto* b = new Batch;
  for (size_t i = 0; i < n; i++) {
    b->status.push_back(std::make_unique<TransferStatus>());
    e->io->Write(*ls[i], src[i] - ls[i]->data, *rs[i], dst[i] - rs[i]->data, len[i], b->status[i].get(),
                 e->io->AllocateTransferUniqueId());
  }
  return b;
}

int kvf_mori_status(void* batch, size_t i) {
  auto* b = static_cast<Batch*>(batch);
  if (i >= b->status.size()) return -1;
  return static_cast<int>(b->status[i]->Code());
}

int kvf_mori_free(void* batch) {
  auto* b = static_cast<Batch*>(batch);
  for (auto& s : b->status)
    if (s->Init() || s->InProgress()) return 4;
  delete b;
  return 0;
}

}  // extern "C"
