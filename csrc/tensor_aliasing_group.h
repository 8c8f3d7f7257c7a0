// TensorAliasingGroup: the no-aliasing guard (NO_TENSOR_ALIASING) for every
// tensor of a frame, which container guards and single tensors join.
#pragma once

#include "guard_accel_common.h"

#include <c10/macros/Macros.h>
#include <c10/util/flat_hash_map.h>

#include <string>
#include <vector>

namespace dynapatch {

// Participants (container guards and single tensors) record the identities
// of the tensors they checked; the group's epilogue guard, which Dynamo runs
// after every other guard passed, decides. A participant that records an
// identity different from the one it holds marks itself dirty. Invariant: a
// participant that is not dirty holds exactly the identities of the last check
// that found all of them pairwise distinct. So when no participant is dirty the
// epilogue passes without looking at a single pointer; otherwise all identities
// go through a hash set, and on success the dirty marks are cleared. Identities
// are compared as raw pointers only, never dereferenced: no tensor is kept
// alive.
class TensorAliasingGroup final : public LeafGuard {
 public:
  explicit TensorAliasingGroup(py::object verbose_code_parts)
      : LeafGuard(std::move(verbose_code_parts)) {}

  struct Participant {
    std::vector<PyObject*> current;
    std::vector<std::string> names;
    bool dirty = true;
  };

  int add_participant(std::vector<std::string> names) {
    Participant p;
    p.current.assign(names.size(), nullptr);
    p.names = std::move(names);
    participants_.push_back(std::move(p));
    return static_cast<int>(participants_.size()) - 1;
  }

  Participant& participant(int index) {
    return participants_[index];
  }

  // The argument (the frame locals, as an epilogue guard) is unused.
  bool check_nopybind(PyObject* /*value*/) override {
    return check();
  }

  GuardDebugInfo check_verbose_nopybind(PyObject* /*value*/) override {
    std::string d = describe_duplicate();
    if (d.empty()) {
      return GuardDebugInfo(true, 1);
    }
    return GuardDebugInfo(false, d, 0);
  }

  bool check() {
    bool dirty = false;
    for (const auto& p : participants_) {
      dirty |= p.dirty;
    }
    if (!dirty) {
      return true;
    }
    seen_.clear();
    for (const auto& p : participants_) {
      for (PyObject* obj : p.current) {
        if (!seen_.insert(obj).second) {
          return false;
        }
      }
    }
    for (auto& p : participants_) {
      p.dirty = false;
    }
    return true;
  }

  // The names of two entries recorded by the last check that are the same
  // tensor, or an empty string.
  std::string describe_duplicate() const {
    ska::flat_hash_map<PyObject*, const std::string*> first;
    for (const auto& p : participants_) {
      for (size_t i = 0; i < p.current.size(); i++) {
        auto inserted = first.insert({p.current[i], &p.names[i]});
        if (!inserted.second) {
          return *inserted.first->second + " and " + p.names[i] +
              " are the same tensor, but the graph was compiled for distinct tensors";
        }
      }
    }
    return "";
  }

  size_t num_tensors() const {
    size_t n = 0;
    for (const auto& p : participants_) {
      n += p.current.size();
    }
    return n;
  }

 private:
  std::vector<Participant> participants_;
  ska::flat_hash_set<PyObject*> seen_;
};

// Records one identity for a participant (see TensorAliasingGroup).
C10_ALWAYS_INLINE void record_identity(
    TensorAliasingGroup::Participant& p,
    int32_t slot,
    PyObject* obj) {
  PyObject*& held = p.current[slot];
  if (held != obj) {
    held = obj;
    p.dirty = true;
  }
}

// The TensorAliasingGroup a Python object (from TensorAliasingGroup()) owns,
// or nullptr if it is not one.
TensorAliasingGroup* aliasing_group_of(PyObject* obj);

} // namespace dynapatch
