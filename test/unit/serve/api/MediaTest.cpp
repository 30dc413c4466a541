// Images from requests (docs/serving.md, "Images"): data URIs through the strict base64 decoder,
// local files only inside the allowed directory, no network.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "runtime/serve/api/Base64.h"
#include "runtime/serve/api/Media.h"
#include "runtime/serve/api/Request.h"
#include "test/unit/TestSupport.h"
#include "test/unit/serve/api/ExpectApiError.h"

namespace dgemma::serve {
namespace {

namespace fs = std::filesystem;
using dgemma::test::fileBytes;
using dgemma::test::mentions;
using dgemma::test::TempDir;
using test::expectApiError;

const std::string kImages = DGEMMA_IMAGE_FIXTURES;
const std::string kParam = "messages[0].content[1].image_url.url";

std::string pngDataUri() { return "data:image/png;base64," + encodeBase64(fileBytes(kImages + "/tiny.png")); }

void expectSameImage(const RgbImage& got, const RgbImage& expected) {
  EXPECT_EQ(got.width, expected.width);
  EXPECT_EQ(got.height, expected.height);
  EXPECT_EQ(got.pixels, expected.pixels);
}

ApiError loadError(const std::string& url, const MediaPolicy& policy = {}) {
  const ApiError error = expectApiError([&] { loadImageUrl(url, policy, kParam); });
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.param, kParam);
  EXPECT_TRUE(mentions(error.what(), kParam + ": ")) << error.what();
  return error;
}

Base64Error base64Error(std::string_view encoded) {
  Base64Error error;
  EXPECT_FALSE(decodeBase64(encoded, error).has_value()) << encoded;
  return error;
}

TEST(ServeBase64, RoundTripsEveryPaddingLength) {
  const std::string bytes("\x00\xff\x10M\xfa", 5);
  for (size_t length = 0; length <= bytes.size(); ++length) {
    const std::string encoded = encodeBase64(bytes.substr(0, length));
    Base64Error error;
    EXPECT_EQ(decodeBase64(encoded, error), bytes.substr(0, length)) << encoded;
  }
  EXPECT_EQ(encodeBase64("Man"), "TWFu");
  EXPECT_EQ(encodeBase64("Ma"), "TWE=");
  EXPECT_EQ(encodeBase64("M"), "TQ==");
}

TEST(ServeBase64, LocatesMalformedInput) {
  Base64Error error = base64Error("TWFu TWE=");
  EXPECT_EQ(error.offset, 9u);  // 9 characters: not a multiple of 4
  EXPECT_TRUE(mentions(error.message, "multiple of 4"));
  error = base64Error("TWFuTW E=");
  EXPECT_EQ(error.offset, 9u);
  error = base64Error("TWFu TWE");  // whitespace is not allowed
  EXPECT_EQ(error.offset, 4u);
  EXPECT_TRUE(mentions(error.message, "got byte 0x20"));
  error = base64Error("TWFu\nTW=");
  EXPECT_EQ(error.offset, 4u);
  EXPECT_TRUE(mentions(error.message, "got byte 0x0a"));
  error = base64Error("TW-u");  // the URL-safe alphabet is not base64
  EXPECT_EQ(error.offset, 2u);
  EXPECT_TRUE(mentions(error.message, "got '-'"));
  error = base64Error("TQ==TWFu");  // padding before the end
  EXPECT_EQ(error.offset, 2u);
  EXPECT_TRUE(mentions(error.message, "padding before the end"));
  error = base64Error("T===");
  EXPECT_EQ(error.offset, 1u);
  error = base64Error("TQ=u");
  EXPECT_EQ(error.offset, 3u);
  EXPECT_TRUE(mentions(error.message, "expected '=' after '=' padding"));
  error = base64Error("TR==");  // "R" leaves non-zero bits that the padding drops
  EXPECT_EQ(error.offset, 1u);
  EXPECT_TRUE(mentions(error.message, "non-canonical"));
  error = base64Error("TWF=");
  EXPECT_EQ(error.offset, 2u);
}

TEST(ServeImageUrl, PngAndJpegDataUris) {
  expectSameImage(loadImageUrl(pngDataUri(), {}, kParam), decodeImage(kImages + "/tiny.png"));
  const std::string jpeg = encodeBase64(fileBytes(kImages + "/photo.jpg"));
  expectSameImage(loadImageUrl("data:image/jpeg;base64," + jpeg, {}, kParam), decodeImage(kImages + "/photo.jpg"));
  expectSameImage(loadImageUrl("DATA:Image/JPG;BASE64," + jpeg, {}, kParam), decodeImage(kImages + "/photo.jpg"));
}

TEST(ServeImageUrl, BadDataUris) {
  EXPECT_TRUE(
      mentions(loadError("data:image/gif;base64,R0lGOD").what(), "expected a data URI of a base64 PNG or JPEG"));
  EXPECT_TRUE(mentions(loadError("data:image/png,rawbytes").what(), "got \"data:image/png,\""));
  EXPECT_TRUE(mentions(loadError("data:image/png;base64").what(), "expected a data URI of the form"));
  EXPECT_TRUE(mentions(loadError("data:image/png;base64,iVBO Rw0").what(), "invalid base64 at offset 4 of the data"));
  // Valid base64, not an image: the decoder's message, naming the part.
  const ApiError notImage = loadError("data:image/png;base64," + encodeBase64("hello, world"));
  EXPECT_TRUE(mentions(notImage.what(), "expected a PNG or JPEG image")) << notImage.what();
  const ApiError truncated = loadError("data:image/png;base64," + encodeBase64(fileBytes(kImages + "/truncated.png")));
  EXPECT_TRUE(mentions(truncated.what(), "invalid PNG image")) << truncated.what();
}

TEST(ServeImageUrl, NoNetwork) {
  for (const char* url : {"http://example.com/cat.png", "https://example.com/cat.png", "HTTPS://example.com/x.png"}) {
    EXPECT_TRUE(mentions(loadError(url).what(), "the server does not fetch from the network; send a data: URI"));
  }
  EXPECT_TRUE(mentions(loadError("ftp://example.com/cat.png").what(), "expected a data: URI or a local file"));
  EXPECT_TRUE(mentions(loadError("").what(), "expected an image URL, got an empty string"));
}

// root/inside/tiny.png, outside/tiny.png next to root, and root/escape.png linking to the outside one.
struct MediaTree {
  TempDir dir;
  fs::path root = dir.path / "root";
  fs::path outside = dir.path / "outside";
  MediaTree() {
    fs::create_directories(root / "inside");
    fs::create_directories(outside);
    fs::copy_file(kImages + "/tiny.png", root / "inside" / "tiny.png");
    fs::copy_file(kImages + "/tiny.png", root / "inside" / "with space.png");
    fs::copy_file(kImages + "/tiny.png", outside / "tiny.png");
    fs::create_symlink(outside / "tiny.png", root / "escape.png");
    fs::create_directory_symlink(outside, root / "escape_dir");
    fs::create_symlink(root / "inside" / "tiny.png", root / "alias.png");
  }
  MediaPolicy policy() const { return {root.string()}; }
};

TEST(ServeImageUrl, SizeLimit) {
  MediaPolicy small;
  small.maxImageBytes = 100;
  EXPECT_TRUE(mentions(loadError(pngDataUri(), small).what(), "expected an image of at most 100 bytes, got about 480"));
  MediaPolicy oneByteShort;
  oneByteShort.maxImageBytes = 479;  // 480 bytes encode without padding: only the decoded size tells
  const std::string bytes480 = fileBytes(kImages + "/tiny.png") + "xy";
  ASSERT_EQ(bytes480.size(), 480u);
  EXPECT_TRUE(mentions(loadError("data:image/png;base64," + encodeBase64(bytes480), oneByteShort).what(),
                       "expected an image of at most 479 bytes, got 480 bytes"));
  MediaTree tree;
  MediaPolicy localSmall = tree.policy();
  localSmall.maxImageBytes = 100;
  EXPECT_TRUE(mentions(loadError("inside/tiny.png", localSmall).what(), "at most 100 bytes, got 478 bytes"));
}

TEST(ServeImageUrl, LocalFilesInsideTheAllowedDirectory) {
  MediaTree tree;
  const RgbImage expected = decodeImage(kImages + "/tiny.png");
  const MediaPolicy policy = tree.policy();
  expectSameImage(loadImageUrl((tree.root / "inside" / "tiny.png").string(), policy, kParam), expected);
  expectSameImage(loadImageUrl("file://" + (tree.root / "inside" / "tiny.png").string(), policy, kParam), expected);
  expectSameImage(loadImageUrl("file://" + (tree.root / "inside" / "with%20space.png").string(), policy, kParam),
                  expected);
  expectSameImage(loadImageUrl("file://localhost" + (tree.root / "inside" / "tiny.png").string(), policy, kParam),
                  expected);
  expectSameImage(loadImageUrl("inside/tiny.png", policy, kParam), expected);  // relative to the directory
  expectSameImage(loadImageUrl("alias.png", policy, kParam), expected);  // a symlink that stays inside
  expectSameImage(loadImageUrl((tree.root / "inside" / ".." / "inside" / "tiny.png").string(), policy, kParam),
                  expected);
}

TEST(ServeImageUrl, LocalFilesCannotEscape) {
  MediaTree tree;
  const MediaPolicy policy = tree.policy();
  const std::string outsideViaDots = (tree.root / ".." / "outside" / "tiny.png").string();
  EXPECT_TRUE(
      mentions(loadError(outsideViaDots, policy).what(), "expected a file inside the allowed local media path"));
  EXPECT_TRUE(mentions(loadError("../outside/tiny.png", policy).what(), "inside the allowed local media path"));
  EXPECT_TRUE(mentions(loadError("escape.png", policy).what(), "inside the allowed local media path"));
  EXPECT_TRUE(mentions(loadError("escape_dir/tiny.png", policy).what(), "inside the allowed local media path"));
  EXPECT_TRUE(mentions(loadError("file://" + (tree.outside / "tiny.png").string(), policy).what(),
                       "inside the allowed local media path"));
  EXPECT_TRUE(mentions(loadError(tree.root.string(), policy).what(), "inside the allowed local media path"));
  EXPECT_TRUE(mentions(loadError("inside", policy).what(), "expected a regular image file"));
  EXPECT_TRUE(mentions(loadError("missing.png", policy).what(), "expected an existing image file"));
  EXPECT_TRUE(mentions(loadError("file://host/x.png", policy).what(), "expected a file URL of a local absolute path"));
  EXPECT_TRUE(mentions(loadError("file:///a%2", policy).what(), "expected a percent escape"));
}

TEST(ServeImageUrl, LocalFilesRefusedWhenNotConfigured) {
  MediaTree tree;
  const ApiError error = loadError((tree.root / "inside" / "tiny.png").string());
  EXPECT_TRUE(mentions(error.what(), "local image files are not allowed"));
}

TEST(ServeMessages, ImagePartsAreDecodedInOrder) {
  MediaTree tree;
  const std::string body = R"({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Compare"},
        {"type": "image_url", "image_url": {"url": ")" +
                           pngDataUri() + R"(", "detail": "low"}},
        {"type": "image_url", "image_url": "inside/tiny.png"}]},
      {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,)" +
                           encodeBase64(fileBytes(kImages + "/photo.jpg")) + R"("}}]}]})";
  const CompletionRequest request = parseCompletionRequest(body, Endpoint::ChatCompletions, tree.policy());
  ASSERT_EQ(request.images.size(), 3u);
  expectSameImage(request.images[0], decodeImage(kImages + "/tiny.png"));
  expectSameImage(request.images[1], decodeImage(kImages + "/tiny.png"));
  expectSameImage(request.images[2], decodeImage(kImages + "/photo.jpg"));
  ASSERT_EQ(request.messages[0].content.size(), 3u);
  EXPECT_EQ(request.messages[0].content[0].kind, ContentPart::Text);
  EXPECT_EQ(request.messages[0].content[1].kind, ContentPart::Image);
  EXPECT_EQ(request.messages[0].content[1].imagePath, "");
  EXPECT_EQ(request.messages[0].content[2].kind, ContentPart::Image);
  EXPECT_EQ(request.messages[1].content[0].kind, ContentPart::Image);
}

TEST(ServeMessages, ImageErrorsNameThePart) {
  const std::string body =
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"},
          {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]})";
  const ApiError error =
      expectApiError([&] { parseCompletionRequest(body, Endpoint::ChatCompletions, MediaPolicy{}); });
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.param, kParam);
  const std::string plainUrl =
      R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "data:image/png;base64,@@@@"}]}]})";
  const ApiError plain =
      expectApiError([&] { parseCompletionRequest(plainUrl, Endpoint::ChatCompletions, MediaPolicy{}); });
  EXPECT_EQ(plain.param, "messages[0].content[0].image_url");
  EXPECT_TRUE(mentions(plain.what(), "invalid base64 at offset 0"));
}

}  // namespace
}  // namespace dgemma::serve
