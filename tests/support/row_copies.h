// Backend::upload_rows / download_rows against whole-tensor copies, on any backend.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace g4::test {

// Uploads distinct words into `order`'s rows of a [rows, cols] I32 tensor (the rest stay zero),
// checks the whole tensor as download sees it, then downloads `order` reversed with download_rows.
// Returns the mismatching words (0 when the row copies are right) and checks a row past the end
// is an error.
int64_t row_copy_mismatches(Backend& be, int64_t rows, int64_t cols, const std::vector<int32_t>& order);

}  // namespace g4::test
