// The images of a chat request (docs/serving.md, "Images"): an image_url part's URL becomes decoded
// RGB pixels.
//
//   data:image/png;base64,...    strict base64 (Base64.h); image/jpeg (or image/jpg) likewise
//   file:///abs/path, /abs/path  only when MediaPolicy::allowedLocalMediaPath is set, and only if the
//                                file, with every symlink followed, lies inside that directory;
//                                relative paths resolve against it
//   http://, https://            refused: the server does not fetch from the network
//
// A file: URL's path is percent-decoded; a plain path is taken literally.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "runtime/data/image/Image.h"

namespace dgemma::serve {

struct MediaPolicy {
  std::string allowedLocalMediaPath;  // empty: local paths refused; else file paths (or file:// URLs) must resolve
                                      // (symlinks followed, canonical) inside it
  size_t maxImageBytes = 32 << 20;    // encoded file size (a data URI's decoded bytes)
};

// The image an image_url URL names. Throws ApiError 400 with `param` (the URL's JSON path, which
// also begins the message) for anything refused, over the size limit or undecodable.
RgbImage loadImageUrl(std::string_view url, const MediaPolicy& policy, const std::string& param);

}  // namespace dgemma::serve
