// dgemma_data_image against PIL's RGB conversion and HF's Gemma4ImageProcessor (torchvision backend);
// expected values come from tools/reference/make_image_fixtures.py.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "support/Error.h"
#include "runtime/data/image/Image.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

const std::string kDir = DGEMMA_IMAGE_FIXTURES;

struct Case {
  const char* name;
  const char* file;
  int jpegTolerance;  // max level difference allowed against PIL's decode
};

const Case kCases[] = {
    {"rgb", "rgb.png", 0},   {"gray", "gray.png", 0}, {"rgba", "rgba.png", 0},
    {"photo", "photo.jpg", 1}, {"wide", "wide.png", 0}, {"tiny", "tiny.png", 0},
};

const SafetensorsFile& expected() {
  static SafetensorsFile file = SafetensorsFile::open(kDir + "/expected.safetensors");
  return file;
}

int64_t scalarOf(const std::string& name) {
  HostTensor t = expected().read(name);
  EXPECT_EQ(t.dtype, DType::I64);
  return t.as<int64_t>()[0];
}

class ImageFixture : public ::testing::TestWithParam<Case> {};

TEST_P(ImageFixture, DecodeMatchesPil) {
  const Case& c = GetParam();
  RgbImage image = decodeImage(kDir + "/" + c.file);
  HostTensor rgb = expected().read(std::string(c.name) + ".rgb");
  ASSERT_EQ(rgb.dtype, DType::U8);
  ASSERT_EQ(rgb.shape, (std::vector<int64_t>{image.height, image.width, 3}));
  ASSERT_EQ(image.pixels.size(), rgb.data.size());
  int maxDiff = 0;
  for (size_t i = 0; i < rgb.data.size(); ++i) {
    maxDiff = std::max(maxDiff, std::abs(int(image.pixels[i]) - int(rgb.data[i])));
  }
  EXPECT_LE(maxDiff, c.jpegTolerance) << c.file;
  std::printf("[decode] %s: max level difference vs PIL %d\n", c.file, maxDiff);
}

TEST_P(ImageFixture, ProcessorMatchesHf) {
  const Case& c = GetParam();
  const std::string name = c.name;
  // Start from PIL's decode so that the processor is checked on exactly HF's input.
  HostTensor rgb = expected().read(name + ".rgb");
  RgbImage image;
  image.height = rgb.shape[0];
  image.width = rgb.shape[1];
  image.pixels = rgb.data;
  Gemma4ImageOptions options;
  options.maxSoftTokens = scalarOf(name + ".opts");
  ProcessedImage out = processGemma4Image(image, options);
  const int64_t maxPatches = options.maxSoftTokens * 9;

  ASSERT_EQ(out.pixelValues.dtype, DType::F32);
  ASSERT_EQ(out.pixelValues.shape, (std::vector<int64_t>{maxPatches, 768}));
  ASSERT_EQ(out.imagePositionIds.dtype, DType::I64);
  ASSERT_EQ(out.imagePositionIds.shape, (std::vector<int64_t>{maxPatches, 2}));
  EXPECT_EQ(out.numSoftTokens, scalarOf(name + ".num_soft_tokens"));

  HostTensor positions = expected().read(name + ".image_position_ids");
  ASSERT_EQ(positions.shape, out.imagePositionIds.shape);
  for (int64_t i = 0; i < maxPatches * 2; ++i) {
    ASSERT_EQ(out.imagePositionIds.as<int64_t>()[i], positions.as<int64_t>()[i]) << "index " << i;
  }
  int64_t realPatches = 0;
  while (realPatches < maxPatches && positions.as<int64_t>()[realPatches * 2] >= 0) ++realPatches;
  EXPECT_EQ(realPatches, out.numSoftTokens * 9);

  const float* values = out.pixelValues.as<float>();
  double maxErr = 0.0;
  // HF's raw float32 values of the first patches.
  HostTensor head = expected().read(name + ".pixel_values_head");
  for (int64_t i = 0; i < head.numElements(); ++i) {
    maxErr = std::max(maxErr, std::abs(double(values[i]) - double(head.as<float>()[i])));
  }
  // HF's values as uint8 levels (value * 255) for every stride-th real patch.
  const int64_t stride = std::stoll(expected().metadata().at("stride"));
  HostTensor levels = expected().read(name + ".levels");
  ASSERT_EQ(levels.shape[0], (realPatches + stride - 1) / stride);
  int levelDiff = 0;
  for (int64_t r = 0; r < levels.shape[0]; ++r) {
    const float* patch = values + r * stride * 768;
    for (int64_t v = 0; v < 768; ++v) {
      const double hf = double(levels.data[r * 768 + v]) / 255.0;
      maxErr = std::max(maxErr, std::abs(double(patch[v]) - hf));
      levelDiff = std::max(levelDiff, std::abs(int(std::lround(patch[v] * 255.0f)) - int(levels.data[r * 768 + v])));
    }
  }
  // Padding is zero.
  for (int64_t i = realPatches * 768; i < maxPatches * 768; ++i) ASSERT_EQ(values[i], 0.0f);
  EXPECT_LE(maxErr, 1e-6);
  EXPECT_EQ(levelDiff, 0);
  std::printf("[processor] %s: %dx%d -> %dx%d, %lld soft tokens, max abs error %.3g\n", c.file, int(image.height),
              int(image.width), int(out.resizedHeight), int(out.resizedWidth), (long long)out.numSoftTokens, maxErr);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ImageFixture, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

void expectDecodeError(const std::string& path, const std::string& fragment) {
  try {
    decodeImage(path);
    FAIL() << "no error for " << path;
  } catch (const InputError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
    EXPECT_EQ(e.exitCode(), 2);
  }
}

void writeAll(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(DecodeImage, MissingFile) { expectDecodeError(kDir + "/does_not_exist.png", "cannot read: No such file or directory"); }

TEST(DecodeImage, TruncatedPng) { expectDecodeError(kDir + "/truncated.png", ": invalid PNG image: "); }

TEST(DecodeImage, TextFileIsUnsupported) {
  expectDecodeError(kDir + "/not_an_image.txt", ": expected a PNG or JPEG image, got a file of unknown format (it starts with ");
}

// stb_image decoded a truncated PGM with uninitialised pixels, and allocated 2.2 GB for a 19-byte PPM
// header claiming 26754 x 26754: formats other than PNG and JPEG are named and refused unread.
TEST(DecodeImage, OtherFormatsAreNamedAndRefused) {
  const std::string dir = ::testing::TempDir();
  writeAll(dir + "/truncated.pgm", std::string("P5\n4 4\n255\n") + std::string(5, '\x10'));
  expectDecodeError(dir + "/truncated.pgm", ": expected a PNG or JPEG image, got a Netpbm (PGM) image; convert it to PNG");
  writeAll(dir + "/huge.ppm", "P6\n26754 26754\n255\n");
  expectDecodeError(dir + "/huge.ppm", ": expected a PNG or JPEG image, got a Netpbm (PPM) image");
  writeAll(dir + "/a.gif", "GIF89a\x01\x00\x01\x00");
  expectDecodeError(dir + "/a.gif", "got a GIF image");
  writeAll(dir + "/a.bmp", "BM\x00\x00");
  expectDecodeError(dir + "/a.bmp", "got a BMP image");
  // Shorter than the magic numbers that sit past the start (WebP at 8, ISO media at 4): found by fuzzing.
  writeAll(dir + "/short.bin", "RIF");
  expectDecodeError(dir + "/short.bin", "got a file of unknown format (it starts with 52 49 46");
  writeAll(dir + "/riff.bin", "RIFFxx");
  expectDecodeError(dir + "/riff.bin", "got a file of unknown format");
}

// The size in the header is checked before anything is allocated.
TEST(DecodeImage, HeadersOverThePixelCapAreRefused) {
  // A PNG signature, an IHDR of 30000 x 30000 and an empty IDAT (png_read_info reads up to it).
  auto chunk = [](const std::string& type, const std::string& data) {
    const std::string body = type + data;
    uint32_t crc = 0xffffffffu;
    for (unsigned char c : body) {
      crc ^= c;
      for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
    }
    crc ^= 0xffffffffu;
    std::string out;
    for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((data.size() >> shift) & 0xff);
    out += body;
    for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((crc >> shift) & 0xff);
    return out;
  };
  const std::string png = std::string("\x89PNG\r\n\x1a\n", 8) +
                          chunk("IHDR", std::string("\x00\x00\x75\x30\x00\x00\x75\x30\x08\x02\x00\x00\x00", 13)) +
                          chunk("IDAT", "");
  try {
    decodeImageBytes(png, "huge.png");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "huge.png: invalid PNG image: 30000 x 30000 pixels; expected at most 89478485 pixels");
  }
  // photo.jpg with its frame header (SOF0/SOF2) claiming 60000 x 60000.
  std::string jpg = readAll(kDir + "/photo.jpg");
  size_t sof = std::string::npos;
  for (size_t i = 2; i + 9 < jpg.size(); ++i)
    if (static_cast<unsigned char>(jpg[i]) == 0xFF && (static_cast<unsigned char>(jpg[i + 1]) == 0xC0 || static_cast<unsigned char>(jpg[i + 1]) == 0xC2)) {
      sof = i;
      break;
    }
  ASSERT_NE(sof, std::string::npos);
  jpg.replace(sof + 5, 4, std::string("\xea\x60\xea\x60", 4));
  try {
    decodeImageBytes(jpg, "huge.jpg");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "huge.jpg: invalid JPEG image: 60000 x 60000 pixels; expected at most 89478485 pixels");
  }
}

// Reading a FIFO would block and a device could be endless; /proc/self/mem fails to read (EIO).
TEST(DecodeImage, UnreadableFilesAreLocatedErrors) {
  const std::string fifo = ::testing::TempDir() + "/image.fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expectDecodeError(fifo, ": expected a regular file, got a FIFO");
  std::remove(fifo.c_str());
  expectDecodeError("/dev/zero", "/dev/zero: expected a regular file, got a character device");
  try {
    decodeImage("/proc/self/mem");
    FAIL() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_EQ(std::string(e.what()), "/proc/self/mem: cannot read: Input/output error");
  }
}

TEST(DecodeImage, CorruptPngAndTruncatedJpeg) {
  const std::string dir = ::testing::TempDir();
  std::string png = readAll(kDir + "/rgb.png");
  ASSERT_GT(png.size(), 100u);
  std::string corrupt = png;
  for (size_t i = 60; i < 90; ++i) corrupt[i] = static_cast<char>(corrupt[i] ^ 0x5a);  // IDAT bytes: CRC fails
  writeAll(dir + "/corrupt.png", corrupt);
  expectDecodeError(dir + "/corrupt.png", ": invalid PNG image: ");
  writeAll(dir + "/signature_only.png", png.substr(0, 8));
  expectDecodeError(dir + "/signature_only.png", ": invalid PNG image: ");
  std::string jpg = readAll(kDir + "/photo.jpg");
  writeAll(dir + "/truncated.jpg", jpg.substr(0, jpg.size() / 2));
  expectDecodeError(dir + "/truncated.jpg", ": invalid JPEG image: ");
  writeAll(dir + "/empty.png", "");
  expectDecodeError(dir + "/empty.png", ": expected a PNG or JPEG image, got an empty file");
}

TEST(Gemma4TargetSize, WorkedExampleOfTheSpec) {
  EXPECT_EQ(gemma4TargetSize(1700, 2200), (std::pair<int64_t, int64_t>{672, 912}));
  // One-pixel-high strip: the height becomes one pooled row, the width is capped.
  EXPECT_EQ(gemma4TargetSize(1, 2000), (std::pair<int64_t, int64_t>{48, 13440}));
  Gemma4ImageOptions seventy;
  seventy.maxSoftTokens = 70;
  EXPECT_EQ(gemma4TargetSize(150, 1, seventy), (std::pair<int64_t, int64_t>{3360, 48}));
}

TEST(Gemma4TargetSize, Errors) {
  EXPECT_THROW(gemma4TargetSize(0, 10), InputError);  // zero-size image: no valid target
  EXPECT_THROW(gemma4TargetSize(10, 0), InputError);
  Gemma4ImageOptions bad;
  bad.maxSoftTokens = 100;
  EXPECT_THROW(gemma4TargetSize(10, 10, bad), InputError);
  RgbImage empty;
  EXPECT_THROW(processGemma4Image(empty), InputError);
}

// A model config that sets vision_soft_tokens_per_image chooses any positive budget: the demo's
// 48 x 48 images at patch 8, pooling 2 and 9 soft tokens keep their size (3 x 3 pooled tokens).
TEST(Gemma4TargetSize, AConfiguredBudgetNeedNotBeAStandardOne) {
  Gemma4ImageOptions options;
  options.patchSize = 8;
  options.poolingKernelSize = 2;
  options.maxSoftTokens = 9;
  options.configuredSoftTokens = true;
  EXPECT_EQ(gemma4TargetSize(48, 48, options), (std::pair<int64_t, int64_t>{48, 48}));
  EXPECT_EQ(gemma4SoftTokenCount(48, 48, options), 9);
  const ProcessedImage processed = processGemma4Image(RgbImage{48, 48, std::vector<uint8_t>(48 * 48 * 3, 255)}, options);
  EXPECT_EQ(processed.pixelValues.shape, (std::vector<int64_t>{36, 192}));
  EXPECT_EQ(processed.numSoftTokens, 9);
  Gemma4ImageOptions unset = options;
  unset.configuredSoftTokens = false;  // the processor's own set: 9 is none of it
  EXPECT_THROW(gemma4TargetSize(48, 48, unset), InputError);
  Gemma4ImageOptions zero = options;
  zero.maxSoftTokens = 0;
  EXPECT_THROW(gemma4TargetSize(48, 48, zero), InputError);
}

TEST(ResizeBicubicAntialias, ConstantImageStaysConstantAndSameSizeIsIdentity) {
  RgbImage image;
  image.width = 7;
  image.height = 5;
  image.pixels.assign(7 * 5 * 3, 200);
  RgbImage up = resizeBicubicAntialias(image, 48, 96);
  EXPECT_TRUE(std::all_of(up.pixels.begin(), up.pixels.end(), [](uint8_t v) { return v == 200; }));
  RgbImage down = resizeBicubicAntialias(up, 3, 2);
  EXPECT_TRUE(std::all_of(down.pixels.begin(), down.pixels.end(), [](uint8_t v) { return v == 200; }));
  EXPECT_EQ(resizeBicubicAntialias(image, 5, 7).pixels, image.pixels);
}

}  // namespace
}  // namespace dgemma
